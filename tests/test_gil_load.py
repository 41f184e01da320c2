"""The server's share of the GIL under load (README "Performance"): at 128 sessions the asyncio thread's work per
20 ms append took the GIL from the engine thread. A session hands its appends to the audio worker half a second
at a time, and the server shortens Python's GIL switch interval so the engine thread gets it back soon.

Tiny model, CPU, the real server on loopback and the openai SDK.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from models.registry import build_pipeline
from realtime.audio import InputStream
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
    at the commit, every sample in order; the reply is the one a server without encode-ahead gives."""
    question = speech_like(1.3, 24000, 4)
    pushed: list[int] = []
    encode = InputStream.encode
    monkeypatch.setattr(InputStream, "encode", lambda self, pcm: (pushed.append(len(pcm)), encode(self, pcm))[1])

    async def ask(url: str) -> tuple[str, bytes]:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn)
            await append(conn, pcm_chunks(question, 480))
            await conn.input_audio_buffer.commit()
            await until(conn, "input_audio_buffer.committed")
            return await reply(conn)

    with running(pipeline, ServerConfig(limits=LIMITS)) as on, \
            running(pipeline, ServerConfig(limits=Limits(max_text_tokens=8, max_frames=6, encode_ahead=False))) as off:
        without = asyncio.run(ask(off[0]))
        pushed.clear()
        assert asyncio.run(ask(on[0])) == without
    batch = int(24000 * InputStream.BATCH_S)
    assert len(pushed) == 3, pushed  # 0.5 s, 0.5 s, and the last 0.3 s at the commit: not 65 jobs
    assert pushed[:2] == [batch, batch] and sum(pushed) == len(question)


def test_the_server_sets_a_short_gil_switch_interval(pipeline):
    before = sys.getswitchinterval()
    try:
        with running(pipeline, ServerConfig(limits=LIMITS)):
            assert sys.getswitchinterval() == pytest.approx(ServerConfig.gil_switch_ms / 1000)
        with running(pipeline, ServerConfig(limits=LIMITS, gil_switch_ms=2.0)):
            assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)
