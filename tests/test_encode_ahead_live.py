"""Encode while the user speaks, in the live session (README "Turn detection"): the input buffer is resampled to 16 kHz
as it arrives and pushed into the model's AudioStream on the audio worker, so a commit encodes only the tail.

The same audio through a server with encode-ahead and one without gives the same reply (text and audio), and the
engine's `audio_ahead` counters show the encoder had the audio's chunks before the commit. Tiny model, CPU, the real
server on loopback and the openai SDK.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import time
import weakref

import numpy as np
import pytest
import torch

from models.qwen3_omni.audio_features import log_mel
from models.qwen3_omni.audio_stream import AudioStream
from models.registry import build_pipeline
from realtime.audio import AudioFormat, InputStream
from realtime.pcm import StreamResampler, float_to_g711, resample
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import client, next_event, pcm16_b64, running, until
from tests.speech import speech_like

LIMITS = Limits(max_text_tokens=8, max_frames=6)


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline("tiny") as p:
        yield p


@pytest.fixture(scope="module")
def servers(pipeline):
    """(url with encode-ahead, url without), one engine."""
    with running(pipeline, ServerConfig(limits=LIMITS)) as on, \
            running(pipeline, ServerConfig(limits=Limits(max_text_tokens=8, max_frames=6, encode_ahead=False))) as off:
        yield on[0], off[0]


def ahead_counters(pipeline) -> dict:
    return pipeline.stats()["audio_ahead"]


def quiet(seconds: float, sr: int = 24000, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3e-4, int(sr * seconds)).astype(np.float32)


@pytest.mark.parametrize("sr", [24000, 8000])
def test_streamed_resampling_is_the_whole_buffer_resampled(sr):
    """Pushes + tail equal a one-shot resample to float rounding, whatever the chunking; `tail` ends nothing."""
    x = torch.from_numpy(speech_like(1.3, sr, 3))
    whole = resample(x, sr, 16000)
    for step in (1, 37, 160, 480, 4000, len(x)):
        r = StreamResampler(sr, 16000)
        parts = [r.push(x[i : i + step]) for i in range(0, len(x), step)]
        got = torch.cat([*parts, r.tail()])
        assert got.shape == whole.shape and float((got - whole).abs().max()) < 1e-6, step
    half = StreamResampler(sr, 16000)
    first = half.push(x[: len(x) // 2])
    early = torch.cat([first, half.tail()])  # a prefix as if it ended there...
    assert float((early - resample(x[: len(x) // 2], sr, 16000)).abs().max()) < 1e-6
    rest = torch.cat([first, half.push(x[len(x) // 2 :]), half.tail()])  # ...and the stream went on unchanged
    assert float((rest - whole).abs().max()) < 1e-6


def test_input_stream_holds_what_it_hands_over(pipeline):
    """A fork taken mid-buffer (a held turn) and the buffer's last take both hold exactly their audio, and each
    encodes as log-mel + encoder of that audio do (to float32 rounding)."""
    x = pcm(speech_like(2.5, 24000, 7))
    stream = InputStream(AudioFormat(), 16000, pipeline.audio_ahead())
    for i in range(0, len(x), 2400):
        feed(stream, x[i : i + 2400])
        if i == 24000:
            early, fork = take(stream, last=False)
    audio, ahead = take(stream, last=True)
    assert fork is not ahead and fork.holds(early) and ahead.holds(audio) and not ahead.holds(early)
    assert ahead.cached_chunks > fork.cached_chunks >= 1
    assert fork._sealed is not None and ahead._sealed is not None  # their commit's host work is done: finish takes it
    for a, enc in ((early, fork), (audio, ahead)):
        feats, mask = log_mel([a])
        feats = feats[0, :, : int(mask.sum())]
        with torch.inference_mode():
            want = enc.tower(feats)
        got = enc.finish()
        assert torch.allclose(got[0], feats, atol=1e-5) and torch.allclose(got[1], want, rtol=1e-4, atol=1e-5)


def test_input_stream_encodes_half_a_second_at_a_time(pipeline):
    """20 ms appends are resampled and encoded once per InputStream.BATCH_S, not one by one; a take holds it all."""
    x = pcm(speech_like(1.2, 24000, 9))
    stream = InputStream(AudioFormat(), 16000, pipeline.audio_ahead())
    piece, batch = 480, int(24000 * InputStream.BATCH_S)
    seen = []
    for i in range(0, len(x), piece):
        feed(stream, x[i : i + piece])
        seen.append((i + piece, stream.ahead.n))
    assert all(n == 0 for pushed, n in seen if pushed < batch)
    assert {n for _, n in seen} == {0, *(n for pushed, n in seen if pushed >= batch)}
    assert len({n for _, n in seen}) == 1 + int(len(x) // batch)  # grew once per batch, not per push
    audio, ahead = take(stream, last=True)
    assert ahead.holds(audio) and abs(len(audio) - 1.2 * 16000) <= 2


def feed(stream: InputStream, pcm: torch.Tensor) -> None:
    """An append, as the session hands it on: gathered, and encoded once a batch has gathered."""
    if (batch := stream.collect(pcm)) is not None:
        stream.encode(batch)


def take(stream: InputStream, last: bool) -> tuple[torch.Tensor, object]:
    """What a commit (or a held turn) gets, as the session asks for it: the rest encoded, then taken."""
    if (rest := stream.rest()) is not None:
        stream.encode(rest)
    return stream.take(last)


def pcm(samples: np.ndarray) -> torch.Tensor:
    """24 kHz float samples as they arrive over the wire (PCM16)."""
    return torch.from_numpy((np.clip(samples, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768.0)


async def open_session(conn, turn_detection: dict | None = None, fmt: dict | None = None) -> None:
    await next_event(conn)
    audio = {"turn_detection": turn_detection, **({"format": fmt} if fmt else {})}
    await conn.session.update(session={"type": "realtime", "audio": {"input": audio}})
    await until(conn, "session.updated")


async def reply(conn, create: bool = True) -> tuple[str, bytes]:
    """The response's transcript and audio bytes (after response.create when `create`)."""
    if create:
        await conn.response.create()
    seen: list[dict] = []
    await until(conn, "response.done", seen)
    assert not [e for e in seen if e["type"] == "error"], seen
    text = "".join(e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta")
    audio = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.output_audio.delta")
    assert audio
    return text, audio


async def append(conn, chunks: list[str]) -> None:
    for c in chunks:
        await conn.input_audio_buffer.append(audio=c)


def pcm_chunks(samples: np.ndarray, step: int = 2400) -> list[str]:
    return [pcm16_b64(samples[i : i + step]) for i in range(0, len(samples), step)]


def test_manual_turns_with_clears_give_the_reply_without_encode_ahead(pipeline, servers):
    """Noise then clear, a 3 s question committed, a second question committed: the same two replies with and
    without encode-ahead; with it, both turns came encoded ahead (their full 1 s chunks before the commit)."""
    junk, q1, q2 = quiet(1.0, seed=5) * 300, speech_like(3.0, 24000, 1), speech_like(2.2, 24000, 2)

    async def conversation(url: str) -> list[tuple[str, bytes]]:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn)
            await append(conn, pcm_chunks(junk))
            await conn.input_audio_buffer.clear()
            await until(conn, "input_audio_buffer.cleared")
            out = []
            for q in (q1, q2):
                await append(conn, pcm_chunks(q))
                await conn.input_audio_buffer.commit()
                await until(conn, "input_audio_buffer.committed")
                out.append(await reply(conn))
            return out

    before = ahead_counters(pipeline)
    without = asyncio.run(conversation(servers[1]))
    assert ahead_counters(pipeline) == before  # that server never encodes ahead
    with_ahead = asyncio.run(conversation(servers[0]))
    after = ahead_counters(pipeline)
    assert with_ahead == without
    assert after["turns"] - before["turns"] == 2
    assert after["chunks_cached"] - before["chunks_cached"] >= 4  # 3 + 2 full chunks minus edge frames


def test_g711_input_encoded_ahead_gives_the_same_reply(pipeline, servers):
    """8 kHz mu-law input: resampled to 16 kHz as it arrives, the same reply as without encode-ahead."""
    q = speech_like(2.4, 8000, 3)
    data = float_to_g711(torch.from_numpy(q), "ulaw")
    chunks = [base64.b64encode(data[i : i + 800]).decode() for i in range(0, len(data), 800)]

    async def turn(url: str) -> tuple[str, bytes]:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn, fmt={"type": "audio/pcmu"})
            await append(conn, chunks)
            await conn.input_audio_buffer.commit()
            await until(conn, "input_audio_buffer.committed")
            return await reply(conn)

    before = ahead_counters(pipeline)
    assert asyncio.run(turn(servers[0])) == asyncio.run(turn(servers[1]))
    after = ahead_counters(pipeline)
    assert after["turns"] - before["turns"] == 1 and after["chunks_cached"] - before["chunks_cached"] >= 1


def test_server_vad_turn_with_its_held_reply_gives_the_same_reply(pipeline, servers):
    """server_vad: the reply held at the first sign of an end of turn is made from a fork of the audio encoded so
    far; the committed reply equals the one made without encode-ahead."""
    audio = np.concatenate([quiet(0.4), speech_like(2.6, 24000, 0), quiet(1.2, seed=2)])
    td = {"type": "server_vad", "silence_duration_ms": 500}

    async def turn(url: str) -> tuple[str, bytes]:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn, td)
            await append(conn, pcm_chunks(audio, 960))
            return await reply(conn, create=False)

    before = ahead_counters(pipeline)
    without = asyncio.run(turn(servers[1]))
    assert asyncio.run(turn(servers[0])) == without
    after = ahead_counters(pipeline)
    # one turn: the held one, released (a louder syllable may raise the log-mel floor over earlier chunks)
    assert after["turns"] - before["turns"] == 1 and after["chunks_cached"] - before["chunks_cached"] >= 1


def live_streams() -> list[AudioStream]:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is AudioStream]


def test_a_session_closed_mid_speech_releases_its_encoder(servers):
    """Audio encoded ahead but never committed is freed with the session."""
    before = {id(s) for s in live_streams()}

    async def go() -> tuple[list[weakref.ref], list[int]]:
        async with client(servers[0]).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn)
            await append(conn, pcm_chunks(speech_like(2.0, 24000, 4)))
            await conn.session.update(session={"type": "realtime"})  # a round trip: the appends were handled
            await until(conn, "session.updated")
            await asyncio.sleep(0.5)  # the queued pushes run on the audio worker
            streams = [s for s in live_streams() if id(s) not in before]
            return [weakref.ref(s) for s in streams], [s.cached_chunks for s in streams]

    new, chunks = asyncio.run(go())
    assert chunks == [1], chunks  # the session's buffer had one AudioStream, its first second encoded
    deadline = time.monotonic() + 10
    while new[0]() is not None:
        assert time.monotonic() < deadline, "the closed session's AudioStream is still alive"
        gc.collect()
        time.sleep(0.1)
