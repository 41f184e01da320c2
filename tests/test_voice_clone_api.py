"""A custom voice spoken by a model that clones: a tiny Qwen3-TTS Base (random weights, x-vector cloning) served
on loopback; the stored sample becomes the reference audio in /v1/audio/speech and in a Realtime response."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from realtime.server import ServerConfig
from realtime.session import Limits
from tests.audio_files import decode, encode_file, tone
from tests.realtime_server import client as async_client
from tests.realtime_server import next_event, running

PRESET = "tiny-tts-base"  # registered here for the test: the tiny preset's config as a Base checkpoint


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAI, str]]:
    from models.qwen3_tts.program import build
    from models.qwen3_tts.tiny import PRESETS, tiny_config

    PRESETS[PRESET] = lambda: tiny_config("base")
    try:
        pipeline = build(PRESET)
        assert pipeline.spec.clones
        cfg = ServerConfig(data_dir=tmp_path_factory.mktemp("data"), limits=Limits(max_frames=10))
        with pipeline, running(pipeline, cfg) as (url, _):
            yield OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300), url
    finally:
        del PRESETS[PRESET]


def test_a_cloned_voice_speaks_in_speech_and_realtime(server) -> None:
    client, url = server
    consent = client.audio.voice_consents.create(
        recording=("consent.wav", encode_file(tone(2.0), 24000, "wav", "pcm_s16le"), "audio/wav"),
        name="me", language="en-US")
    samples = [encode_file(tone(3.0, 44100, hz), 44100, "mp3", "libmp3lame") for hz in (140.0, 330.0)]
    voices = [client.audio.voices.create(audio_sample=("s.mp3", s, "audio/mpeg"), consent=consent.id, name="v")
              for s in samples]
    spoken = [client.audio.speech.create(model="tts", input="Hello there", voice={"id": v.id},
                                         response_format="wav").content for v in voices]
    for audio in spoken:
        rate, n, _ = decode(audio)
        assert rate == 24000 and n > 0 and n % 1920 == 0
    assert spoken[0] != spoken[1], "two reference samples gave the same speech"
    with pytest.raises(openai.BadRequestError) as e:  # this model has no voice of its own
        client.audio.speech.create(model="tts", input="Hello", voice="alloy")
    assert "reference audio" in e.value.body["message"]

    async def realtime() -> tuple[dict, int]:
        async with async_client(url).realtime.connect(model="tts") as conn:
            await next_event(conn)
            await conn.send_raw(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "audio": {"output": {"voice": {"id": voices[0].id}}}}}))
            assert (await next_event(conn))["type"] == "session.updated"
            await conn.send_raw(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}}))
            await conn.send_raw(json.dumps({"type": "response.create"}))
            deltas = 0
            while (event := await next_event(conn))["type"] != "response.done":
                assert event["type"] != "error", event
                deltas += event["type"] == "response.output_audio.delta"
            return event["response"], deltas

    response, deltas = asyncio.run(realtime())
    assert deltas > 0 and response["audio"]["output"]["voice"] == voices[0].id
