"""The server's share of the GIL under load (README "Performance"): at 128 sessions the asyncio thread's work per
20 ms append took the GIL from the engine thread. A session hands its appends to the audio worker half a second
at a time, and the server shortens Python's GIL switch interval so the engine thread gets it back soon.

Tiny model, CPU, the real server on loopback and the openai SDK.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest
import torch

from models.registry import build_pipeline
from realtime.audio import AudioFormat, InputStream
from realtime.input_audio import AudioWorkers
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import client, running, until
from tests.speech import speech_like
from tests.test_encode_ahead_live import append, open_session, pcm_chunks, reply

LIMITS = Limits(max_text_tokens=8, max_frames=6)


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline("tiny") as p:
        yield p


def test_20ms_appends_reach_the_audio_worker_half_a_second_at_a_time(pipeline, monkeypatch):
    """65 appends of 20 ms: the worker encodes the input stream once per InputStream.BATCH_S and once with the rest
    at the commit, every sample in order; the reply is the one a server without encode-ahead gives. (EAGER_S off:
    the workers as under load, never idle when an append comes.)"""
    question = speech_like(1.3, 24000, 4)
    monkeypatch.setattr(InputStream, "EAGER_S", 0.0)
    pushed = batches_with_the_reply_unchanged(pipeline, monkeypatch, question, pace_s=0.0)
    batch = int(24000 * InputStream.BATCH_S)
    assert len(pushed) == 3, pushed  # 0.5 s, 0.5 s, and the last 0.3 s at the commit: not 65 jobs
    assert pushed[:2] == [batch, batch] and sum(pushed) == len(question)


def batches_with_the_reply_unchanged(pipeline, monkeypatch, question, pace_s: float) -> list[int]:
    """The batches (samples each) the audio worker encoded for `question`, sent in 20 ms appends `pace_s` apart
    and committed; asserts the reply is the one a server without encode-ahead gives."""
    pushed: list[int] = []
    encode = InputStream.encode
    monkeypatch.setattr(InputStream, "encode", lambda self, pcm: (pushed.append(len(pcm)), encode(self, pcm))[1])

    async def ask(url: str) -> tuple[str, bytes]:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn)
            for chunk in pcm_chunks(question, 480):
                await conn.input_audio_buffer.append(audio=chunk)
                await asyncio.sleep(pace_s)
            await conn.input_audio_buffer.commit()
            await until(conn, "input_audio_buffer.committed")
            return await reply(conn)

    with running(pipeline, ServerConfig(limits=LIMITS)) as on, \
            running(pipeline, ServerConfig(limits=Limits(max_text_tokens=8, max_frames=6, encode_ahead=False))) as off:
        without = asyncio.run(ask(off[0]))
        pushed.clear()
        assert asyncio.run(ask(on[0])) == without
    return pushed


def test_the_server_sets_a_short_gil_switch_interval(pipeline):
    before = sys.getswitchinterval()
    try:
        with running(pipeline, ServerConfig(limits=LIMITS)):
            assert sys.getswitchinterval() == pytest.approx(ServerConfig.gil_switch_ms / 1000)
        with running(pipeline, ServerConfig(limits=LIMITS, gil_switch_ms=2.0)):
            assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)


def test_idle_audio_workers_take_appends_a_tenth_of_a_second_at_a_time(pipeline, monkeypatch):
    """While no audio job is queued or running, the gathered appends go on at InputStream.EAGER_S: the commit then
    finds at most that much of its audio still to encode. The reply is unchanged."""
    question = speech_like(1.3, 24000, 4)
    pushed = batches_with_the_reply_unchanged(pipeline, monkeypatch, question, pace_s=0.004)  # a live client's pace
    eager, batch = int(24000 * InputStream.EAGER_S), int(24000 * InputStream.BATCH_S)
    assert sum(pushed) == len(question) and all(n % 480 == 0 or n == pushed[-1] for n in pushed)
    assert all(eager <= n <= batch for n in pushed[:-1]), pushed
    assert len(pushed) > 1 + len(question) // batch and min(pushed[:-1]) == eager, pushed  # not BATCH_S alone


def test_an_input_stream_gathers_to_eager_s_only_while_the_workers_are_idle(pipeline):
    stream = InputStream(AudioFormat(), 16000, None)
    piece = torch.zeros(480)
    eager = int(24000 * InputStream.EAGER_S) // 480
    assert all(stream.collect(piece, idle=False) is None for _ in range(eager + 1))
    assert stream.collect(piece, idle=True).shape[0] == (eager + 2) * 480  # idle now: all that gathered goes
    assert all(stream.collect(piece, idle=True) is None for _ in range(eager - 1))
    assert stream.collect(piece, idle=True).shape[0] == eager * 480
    busy = [stream.collect(piece, idle=False) for _ in range(int(24000 * InputStream.BATCH_S) // 480)]
    assert all(b is None for b in busy[:-1]) and busy[-1].shape[0] == int(24000 * InputStream.BATCH_S)


def test_audio_workers_count_their_queued_and_running_jobs():
    workers = AudioWorkers(1)
    go = threading.Event()
    try:
        assert workers.idle
        first, second = workers.submit(go.wait, 10), workers.submit(lambda: 1)
        assert not workers.idle and workers.jobs == 2
        go.set()
        assert first.result(10) and second.result(10) == 1
        deadline = time.monotonic() + 10
        while not workers.idle and time.monotonic() < deadline:  # a done callback runs just after the result
            time.sleep(0.001)
        assert workers.idle and workers.jobs == 0
        failed = workers.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(10)
        while not workers.idle and time.monotonic() < deadline:
            time.sleep(0.001)
        assert workers.idle
    finally:
        go.set()
        workers.shutdown()
    with pytest.raises(RuntimeError):  # refused after shutdown: not counted as queued
        workers.submit(lambda: 1)
    assert workers.idle


def test_a_failed_input_batch_fails_its_commit_alone_and_the_session_goes_on(pipeline, monkeypatch, caplog):
    """A batch that fails on the audio worker is logged where it fails; the commit that needs it gets an error
    event (never audio with a piece missing); after a clear, the same session answers as a fresh server does."""
    question = speech_like(1.3, 24000, 4)
    encode, calls = InputStream.encode, []

    def flaky(self, pcm):
        calls.append(len(pcm))
        if len(calls) == 2:
            raise RuntimeError("resampler exploded")
        return encode(self, pcm)

    monkeypatch.setattr(InputStream, "encode", flaky)

    async def ask(url: str, fail_first: bool) -> tuple[str, bytes]:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn)
            if fail_first:
                await append(conn, pcm_chunks(question, 480))
                await conn.input_audio_buffer.commit()
                error = await until(conn, "error")
                assert error["error"]["type"] == "server_error", error
                await conn.input_audio_buffer.clear()
                await until(conn, "input_audio_buffer.cleared")
            await append(conn, pcm_chunks(question, 480))
            await conn.input_audio_buffer.commit()
            await until(conn, "input_audio_buffer.committed")
            return await reply(conn)

    with running(pipeline, ServerConfig(limits=LIMITS)) as (url, _):
        with caplog.at_level("ERROR"):
            after = asyncio.run(ask(url, True))
        assert "input audio work failed" in caplog.text and "resampler exploded" in caplog.text
        assert asyncio.run(ask(url, False)) == after
