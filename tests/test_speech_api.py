"""POST /v1/audio/speech through the real openai SDK against the real server on loopback, serving the tiny
text-to-speech model: every response_format decodes back to the right rate and length, audio streams as it is
made, SSE events carry the audio and usage, and bad requests get OpenAI's error shape and status."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from openai import OpenAI

from models.registry import build_pipeline
from pipelines.pipeline import Pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.audio_files import decode
from tests.realtime_server import running

FRAMES = 12  # each reply is capped here (a tiny random model never stops by itself)
KEY = "speech-key"
TEXT = "Hello there, this is a test."
SLACK = {"mp3": 2 * 1152, "aac": 2 * 1024, "opus": 0, "flac": 0, "wav": 0}  # the lossy codecs' delay + padding


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAI, str, Pipeline]]:
    pipeline = build_pipeline("tiny-tts")
    cfg = ServerConfig(api_key=KEY, data_dir=tmp_path_factory.mktemp("data"), limits=Limits(max_frames=FRAMES))
    with pipeline, running(pipeline, cfg) as (url, _):
        yield OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=300), url, pipeline


@pytest.fixture(scope="module")
def reference(server: tuple[OpenAI, str]) -> np.ndarray:
    """One reply as pcm: the tiny model samples with a fixed seed, so every request of TEXT says the same."""
    client, _, _ = server
    pcm = np.frombuffer(client.audio.speech.create(model="tts-1", input=TEXT, voice="alloy",
                                                   response_format="pcm").content, "<i2")
    assert len(pcm) and len(pcm) % 1920 == 0 and len(pcm) // 1920 <= FRAMES  # whole 80 ms frames at 24 kHz
    assert np.abs(pcm).max() > 0
    return pcm


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_every_format_decodes_to_the_rate_and_length(server, reference, fmt: str) -> None:
    client, _, _ = server
    data = client.audio.speech.create(model="tts-1", input=TEXT, voice="alloy", response_format=fmt).content
    rate, n, _ = decode(data)
    want_rate = 48000 if fmt == "opus" else 24000
    want = len(reference) * want_rate // 24000
    assert rate == want_rate
    assert want <= n <= want + SLACK[fmt] * want_rate // 24000, (fmt, n, want)


def test_same_reply_twice_and_model_voices(server, reference) -> None:
    client, _, _ = server
    again = client.audio.speech.create(model="gpt-4o-mini-tts", input=TEXT, voice="vivian", response_format="pcm")
    assert np.array_equal(np.frombuffer(again.content, "<i2"), reference)  # alloy is the model's default, vivian
    other = client.audio.speech.create(model="x", input=TEXT, voice="ryan", response_format="pcm",
                                       instructions="Speak slowly and warmly.")
    assert len(other.content) % 3840 == 0 and not np.array_equal(np.frombuffer(other.content, "<i2"), reference)


def test_speed_scales_the_length_keeping_the_rate(server, reference) -> None:
    client, _, _ = server
    for speed in (2.0, 0.5):
        data = client.audio.speech.create(model="tts-1", input=TEXT, voice="alloy", response_format="pcm",
                                          speed=speed).content
        assert abs(len(data) // 2 - len(reference) / speed) <= 0.01 * len(reference) / speed, (speed, len(data))


def test_stream_format_audio_arrives_in_chunks_as_made(server, reference) -> None:
    client, _, _ = server
    start, times, chunks = time.perf_counter(), [], []
    with client.audio.speech.with_streaming_response.create(model="tts-1", input=TEXT, voice="alloy",
                                                            response_format="pcm", stream_format="audio") as r:
        assert r.headers["content-type"].startswith("audio/pcm")
        assert r.headers.get("transfer-encoding") == "chunked"
        for chunk in r.iter_bytes():
            chunks.append(chunk)
            times.append(time.perf_counter() - start)
    assert b"".join(chunks) == reference.tobytes()
    assert len(chunks) >= 3 and times[0] < 0.8 * times[-1], "the first audio came only at the end"


def test_sse_events_carry_the_audio_and_usage(server, reference) -> None:
    client, _, _ = server
    with client.audio.speech.with_streaming_response.create(model="tts-1", input=TEXT, voice="alloy",
                                                            response_format="pcm", stream_format="sse") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done" and len(deltas) == len(events) - 1
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert audio == reference.tobytes()
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == len(reference) // 1920 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_sse_in_another_format_decodes(server, reference) -> None:
    client, _, _ = server
    with client.audio.speech.with_streaming_response.create(model="tts-1", input=TEXT, voice="alloy",
                                                            response_format="wav", stream_format="sse") as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    rate, n, _ = decode(b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"))
    assert (rate, n) == (24000, len(reference))


@pytest.mark.parametrize("change, status, param, text", [
    ({"input": "x" * 4097}, 400, "input", "maximum is 4096"),
    ({"input": ""}, 400, "input", "non-empty"),
    ({"speed": 4.5}, 400, "speed", "0.25 to 4.0"),
    ({"speed": 0.1}, 400, "speed", "0.25 to 4.0"),
    ({"voice": "nobody"}, 400, "voice", "unknown voice 'nobody'"),
    ({"voice": {"id": "voice_0000"}}, 404, "voice", "No custom voice found"),
    ({"response_format": "ogg"}, 400, "response_format", "mp3, opus, aac, flac, wav, pcm"),
    ({"stream_format": "chunks"}, 400, "stream_format", "audio, sse"),
    ({"response_format": ["mp3"]}, 400, "response_format", "mp3, opus, aac, flac, wav, pcm"),
    ({"stream_format": {"type": "sse"}}, 400, "stream_format", "audio, sse"),
])
def test_bad_requests_get_openai_errors(server, change: dict, status: int, param: str, text: str) -> None:
    client, _, _ = server
    args = {"model": "tts-1", "input": TEXT, "voice": "alloy"} | change
    with pytest.raises(openai.APIStatusError) as e:
        client.audio.speech.create(**args)
    assert e.value.status_code == status
    error = e.value.body
    assert error["param"] == param and text in error["message"] and error["type"] == "invalid_request_error"


def test_the_input_limit_is_inclusive(server) -> None:
    client, _, _ = server
    data = client.audio.speech.create(model="tts-1", input="a" * 4096, voice="alloy", response_format="pcm")
    assert len(data.content) > 0


def test_without_the_key_nothing_is_spoken(server) -> None:
    _, url, _ = server
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=url, api_key="wrong", max_retries=0).audio.speech.create(model="tts-1", input=TEXT,
                                                                                voice="alloy")


def idle(pipeline: Pipeline, timeout_s: float = 30.0) -> dict:
    """The engine's counters once no turn or session is left (or as they are at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counters = pipeline.stats()
        if counters["turns_active"] == 0 and counters["sessions"] == 0 or time.monotonic() > deadline:
            return counters
        time.sleep(0.05)


def test_a_client_that_leaves_mid_stream_frees_its_turn(server) -> None:
    client, _, pipeline = server
    with client.audio.speech.with_streaming_response.create(model="tts-1", input=TEXT, voice="alloy",
                                                            response_format="mp3") as r:
        assert next(r.iter_bytes())  # one chunk, then the client goes away
    counters = idle(pipeline)
    assert counters["turns_active"] == 0 and counters["sessions"] == 0
    assert counters["turns_started"] == counters["turns_ended"] > 0
    assert not any(counters["kv_blocks"].values()), counters["kv_blocks"]
    again = client.audio.speech.create(model="tts-1", input=TEXT, voice="alloy", response_format="pcm")
    assert len(again.content) > 0


def test_a_model_that_does_not_read_aloud_says_so(tmp_path: Path) -> None:
    pipeline = build_pipeline("tiny-thinker")
    with pipeline, running(pipeline, ServerConfig(data_dir=tmp_path)) as (url, _), \
            pytest.raises(openai.BadRequestError) as e:
        OpenAI(base_url=url, api_key="none", max_retries=0).audio.speech.create(model="tts-1", input=TEXT,
                                                                               voice="alloy")
    assert e.value.body["code"] == "model_not_supported" and "does not read text aloud" in e.value.body["message"]
