"""semantic_vad through the real server and the openai SDK: Smart Turn ends a finished question early, and a
server without the model file serves the session as server_vad (with a warning) instead of failing."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from benchmarks.turn_corpus import RATE, available, utterance
from models.registry import build_pipeline
from realtime.pcm import resample
from realtime.server import ServerConfig
from realtime.session import Limits
from realtime.smart_turn import ENV, turn_model_path
from realtime.turn_presets import EAGERNESS
from tests.realtime_server import append_audio, client, next_event, running, until

pytestmark = pytest.mark.skipif(not available(), reason="needs espeak-ng and sox (.ci/run installs them)")


@pytest.fixture(scope="module")
def server():
    with build_pipeline("tiny") as p, running(p, ServerConfig(limits=Limits(max_text_tokens=4, max_frames=4))) as s:
        yield s[0]


def _stop_after_speech(url: str, eagerness: str) -> tuple[float, list[str]]:
    """One spoken question with semantic_vad: ms from the last word to speech_stopped, and the event types."""
    u = utterance(0, "whole", tail_ms=2000)
    audio = resample(torch.from_numpy(u.audio), RATE, 24000).numpy()

    async def go() -> tuple[float, list[str]]:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "semantic_vad", "eagerness": eagerness}}}})
            updated = await until(conn, "session.updated")
            assert updated["session"]["audio"]["input"]["turn_detection"]["eagerness"] == eagerness
            await append_audio(conn, audio, chunk_s=0.1)
            seen: list[dict] = []
            await until(conn, "response.done", seen)
            stopped = next(e for e in seen if e["type"] == "input_audio_buffer.speech_stopped")
            return stopped["audio_end_ms"] - u.speech_end_s * 1000, [e["type"] for e in seen]

    return asyncio.run(go())


def test_semantic_vad_ends_a_finished_question_early(server):
    if not turn_model_path().is_file():
        pytest.fail(f"Smart Turn model missing at {turn_model_path()}: `make` fetches it")
    wait_ms, types = _stop_after_speech(server, "auto")
    assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.speech_stopped") \
        < types.index("input_audio_buffer.committed") < types.index("response.created")
    assert wait_ms <= EAGERNESS["auto"].candidate_ms + 200, wait_ms  # not the 1000 ms maximum


def test_semantic_vad_without_the_model_is_served_as_server_vad(server, monkeypatch, caplog, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path / "absent.onnx"))
    with caplog.at_level(logging.WARNING, logger="realtime.vad"):
        wait_ms, types = _stop_after_speech(server, "high")
    assert "semantic_vad served as server_vad" in caplog.text
    assert "input_audio_buffer.committed" in types and "error" not in types
    assert 250 - 100 <= wait_ms <= 256 + 100, wait_ms  # server_vad with eagerness high's 250 ms of silence
