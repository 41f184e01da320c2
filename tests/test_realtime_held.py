"""A reply started in the silence, through the real server and the openai SDK (tiny model, CPU).

Speech is streamed in real time; the VAD's EndLikely starts the turn held back, SpeechStopped's commit
releases it. Every server event is validated against the SDK's types (tests/realtime_server.next_event).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time

import numpy as np
import pytest

from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import client, next_event, pcm16_b64, running
from tests.speech import speech_like

LIMITS = Limits(max_text_tokens=8, max_frames=6)
GA_ORDER = ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "conversation.item.added",
            "conversation.item.done", "response.created"]
SR = 24000
# EndLikely comes 160 ms into the pause, the commit at silence_duration_ms: on a busy 2-core CPU the tiny
# model needs about half a second to its first audio, so the pause leaves it that long
SILENCE_MS = 800


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline("tiny") as p:
        yield p


@pytest.fixture(scope="module")
def server(pipeline):
    with running(pipeline, ServerConfig(limits=LIMITS)) as s:
        yield s


def quiet(seconds: float, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3e-4, int(SR * seconds)).astype(np.float32)


def spoken(*parts: tuple[str, float], seed: int = 0) -> np.ndarray:
    """("speech" | "pause", seconds) parts, one after another."""
    out = [speech_like(s, SR, seed + i) if kind == "speech" else quiet(s, seed + i)
           for i, (kind, s) in enumerate(parts)]
    return np.concatenate(out)


async def stream(conn, audio: np.ndarray, events: list[tuple[float, dict]], chunk_s: float = 0.04) -> None:
    """Append in real time, collecting every server event (with its arrival time) meanwhile."""
    step = int(SR * chunk_s)
    start = time.perf_counter()
    for n, i in enumerate(range(0, len(audio), step)):
        await conn.input_audio_buffer.append(audio=pcm16_b64(audio[i : i + step]))
        while (wait := start + (n + 1) * chunk_s - time.perf_counter()) > 0:
            try:
                events.append((time.perf_counter(), await next_event(conn, wait)))
            except TimeoutError:
                break


async def drain(conn, events: list[tuple[float, dict]], until_type: str) -> None:
    """Events until one of `until_type` has come (it may have come while streaming)."""
    while not any(e["type"] == until_type for _, e in events):
        events.append((time.perf_counter(), await next_event(conn)))


async def open_session(conn, silence_ms: int = 500) -> None:
    await next_event(conn)
    await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": silence_ms}}}})
    while (await next_event(conn))["type"] != "session.updated":
        pass


def stats(server) -> dict:
    return server[1].pipeline.stats()


def test_released_reply_comes_in_ga_order_and_at_once(server):
    """Spoken questions (three a session, two sessions), each answered by its held turn: the GA order,
    and commit -> first audio delta."""
    url = server[0]
    before = stats(server)
    latencies: list[float] = []

    async def session() -> None:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn, silence_ms=SILENCE_MS)
            for seed in (0, 10, 40):  # (speech_like voices the detector hears as speech)
                events: list[tuple[float, dict]] = []
                # the commit comes SILENCE_MS after the last voiced frame (at most 2.37 s in); the reply is
                # awaited after the stream, so the silence need not outlast it
                await stream(conn, spoken(("pause", 0.3), ("speech", 1.2), ("pause", 1.1), seed=seed), events)
                await drain(conn, events, "response.done")
                types = [e["type"] for _, e in events]
                start = types.index("input_audio_buffer.speech_stopped")
                assert types[start : start + len(GA_ORDER)] == GA_ORDER, types
                assert types.count("response.created") == 1
                committed = next(t for t, e in events if e["type"] == "input_audio_buffer.committed")
                first = next(t for t, e in events if e["type"] == "response.output_audio.delta")
                latencies.append(first - committed)
                item = next(e for _, e in events if e["type"] == "input_audio_buffer.committed")["item_id"]
                done = next(e for _, e in events if e["type"] == "response.done")["response"]
                assert done["status"] in ("completed", "incomplete") and done["output"], done  # (LIMITS cap it)
                assert item == next(e for _, e in events if e["type"] == "conversation.item.added")["item"]["id"]

    for _ in range(2):
        asyncio.run(session())
    after = stats(server)
    assert after["held_released"] - before["held_released"] == 6  # every reply was the held one
    p50 = statistics.median(latencies) * 1e3
    print(f"commit -> first audio delta with the held turn released: p50 {p50:.1f} ms, "
          f"all {[round(x * 1e3, 1) for x in latencies]}")
    assert p50 < 50, latencies


def test_discarded_reply_sends_nothing_and_leaves_nothing(server):
    """A pause long enough for EndLikely but not for the end of the turn, then more speech: the held turn
    is discarded; the client sees exactly one response, to the whole utterance; nothing is left after."""
    url = server[0]
    before = stats(server)

    async def go() -> list[dict]:
        events: list[tuple[float, dict]] = []
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn, silence_ms=800)
            audio = np.concatenate([quiet(0.3), speech_like(1.2, SR, 0), quiet(0.45, 2), speech_like(1.2, SR, 10),
                                    quiet(1.5, 3)])
            await stream(conn, audio, events)
            await drain(conn, events, "response.done")
            with contextlib.suppress(TimeoutError):  # a stray event of the discarded turn would come by now
                while True:
                    events.append((time.perf_counter(), await next_event(conn, 1.0)))
        return [e for _, e in events]

    seen = asyncio.run(go())
    types = [e["type"] for e in seen]
    assert types[types.index("response.done") + 1 :] in ([], ["rate_limits.updated"]), types
    assert types.count("input_audio_buffer.speech_started") == 1 and types.count("response.created") == 1
    rid = next(e for e in seen if e["type"] == "response.created")["response"]["id"]
    assert all(e.get("response_id", rid) == rid for e in seen)
    assert {e["response"]["id"] for e in seen if "response" in e} == {rid}
    after = stats(server)
    assert after["held_discarded"] - before["held_discarded"] >= 1
    assert after["held_released"] - before["held_released"] == 1
    deadline = time.monotonic() + 10
    while (now := stats(server))["sessions"] or now["turns_active"]:  # the socket closed: its session ends
        assert time.monotonic() < deadline, now
        time.sleep(0.1)
    assert now["held"] == 0 and now["turns_started"] == now["turns_ended"]
    assert set(now["kv_blocks"].values()) == {0} and set(now["stream_slots"].values()) == {0}, now
