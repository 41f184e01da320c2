"""Custom voices as OpenAI's API has them (/v1/audio/voice_consents, /v1/audio/voices) through the real openai SDK
against the real server: create, list, retrieve, update and delete; bad samples and missing consents refused
clearly; only key holders reach them; a voice survives a restart of `serve`; a voice id in /v1/audio/speech and in
a Realtime session resolves from the store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from models.registry import build_pipeline, describe
from realtime.server import ServerConfig
from realtime.session import Limits
from realtime.voice_store import MAX_UPLOAD_BYTES
from tests.audio_files import decode, encode_file, tone
from tests.realtime_server import client as async_client
from tests.realtime_server import next_event, running, until
from tests.serve_process import serve

KEY = "voices-key"


def wav(seconds: float) -> tuple[str, bytes, str]:
    return "consent.wav", encode_file(tone(seconds), 24000, "wav", "pcm_s16le"), "audio/wav"


def mp3(seconds: float) -> tuple[str, bytes, str]:
    return "sample.mp3", encode_file(tone(seconds, 44100), 44100, "mp3", "libmp3lame"), "audio/mpeg"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAI, str]]:
    pipeline = build_pipeline("tiny-tts")
    cfg = ServerConfig(api_key=KEY, data_dir=tmp_path_factory.mktemp("data"), limits=Limits(max_frames=8))
    with pipeline, running(pipeline, cfg) as (url, _):
        yield OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120), url


def test_consents_create_list_retrieve_update_delete(server) -> None:
    client, _ = server
    made = [client.audio.voice_consents.create(recording=wav(2.0), name=f"consent {i}", language="en-US")
            for i in range(3)]
    assert made[0].object == "audio.voice_consent" and made[0].id.startswith("cons_")
    assert (made[0].name, made[0].language) == ("consent 0", "en-US")
    assert client.audio.voice_consents.retrieve(made[1].id) == made[1]
    listed = [c.id for c in client.audio.voice_consents.list(limit=2)]  # the SDK pages through all of them
    assert listed[:3] == [m.id for m in reversed(made)]
    page = client.audio.voice_consents.list(limit=2)
    assert len(page.data) == 2 and page.has_more
    assert client.audio.voice_consents.update(made[0].id, name="renamed").name == "renamed"
    gone = client.audio.voice_consents.delete(made[2].id)
    assert gone.deleted and gone.id == made[2].id
    with pytest.raises(openai.NotFoundError):
        client.audio.voice_consents.retrieve(made[2].id)


def test_voices_create_list_retrieve_delete(server) -> None:
    client, _ = server
    consent = client.audio.voice_consents.create(recording=wav(2.0), name="me", language="en-US")
    voice = client.audio.voices.create(audio_sample=mp3(3.0), consent=consent.id, name="my voice")
    assert voice.object == "audio.voice" and voice.type == "audio_sample" and voice.id.startswith("voice_")
    assert voice.name == "my voice" and voice.created_at > 0
    assert client.get(f"/audio/voices/{voice.id}", cast_to=openai.types.audio.Voice) == voice
    listed = client.get("/audio/voices", cast_to=object)
    assert voice.id in [v["id"] for v in listed["data"]]
    deleted = client.audio.voices.delete(voice.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (voice.id, True, "audio.voice.deleted")
    with pytest.raises(openai.NotFoundError):
        client.audio.voices.delete(voice.id)


@pytest.mark.parametrize("sample, status, code, text", [
    (("junk.wav", b"RIFF not really audio" * 50, "audio/wav"), 400, "invalid_audio", "could not be decoded"),
    (("short.wav", encode_file(tone(0.3), 24000, "wav", "pcm_s16le"), "audio/wav"), 400, "invalid_audio",
     "shorter than 1 s"),
    (("big.wav", b"\0" * (MAX_UPLOAD_BYTES + 100_000), "audio/wav"), 413, "file_too_large", "10 MiB"),
])
def test_bad_samples_are_refused_clearly(server, sample, status: int, code: str, text: str) -> None:
    client, _ = server
    consent = client.audio.voice_consents.create(recording=wav(1.5), name="c", language="en")
    with pytest.raises(openai.APIStatusError) as e:
        client.audio.voices.create(audio_sample=sample, consent=consent.id, name="bad")
    assert e.value.status_code == status and e.value.body["code"] == code and text in e.value.body["message"]


def test_a_voice_needs_a_real_consent_and_a_sample(server) -> None:
    client, _ = server
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.voices.create(audio_sample=mp3(2.0), consent="cons_missing", name="v")
    assert e.value.body["param"] == "consent" and "create one first" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.voices.create(type="prompt", name="v", prompt="a deep voice")
    assert e.value.body["param"] == "type"


def test_only_key_holders_reach_voices(server) -> None:
    client, url = server
    consent = client.audio.voice_consents.create(recording=wav(1.5), name="c", language="en")
    stranger = OpenAI(base_url=url, api_key="not-the-key", max_retries=0)
    for call in (lambda: stranger.audio.voice_consents.create(recording=wav(1.5), name="x", language="en"),
                 lambda: stranger.audio.voice_consents.list().data,
                 lambda: stranger.audio.voice_consents.retrieve(consent.id),
                 lambda: stranger.audio.voice_consents.delete(consent.id),
                 lambda: stranger.audio.voices.create(audio_sample=mp3(2.0), consent=consent.id, name="v"),
                 lambda: stranger.audio.speech.create(model="tts-1", input="hi", voice={"id": "voice_1"})):
        with pytest.raises(openai.AuthenticationError):
            call()
    assert client.audio.voice_consents.retrieve(consent.id).id == consent.id


def speak_in(client: OpenAI, voice_id: str) -> bytes:
    """Speech in a custom voice: its audio where the model clones, else the clear refusal (which only a stored voice
    gets: an unknown id is 404)."""
    if describe("tiny-tts").clones:
        return client.audio.speech.create(model="tts-1", input="Hello", voice={"id": voice_id},
                                          response_format="wav").content
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model="tts-1", input="Hello", voice={"id": voice_id})
    assert "cannot speak in a custom voice" in e.value.body["message"] and e.value.body["param"] == "voice"
    return b""


def test_a_custom_voice_in_speech_and_in_realtime(server) -> None:
    client, url = server
    consent = client.audio.voice_consents.create(recording=wav(2.0), name="me", language="en-US")
    voice = client.audio.voices.create(audio_sample=mp3(3.0), consent=consent.id, name="mine")
    audio = speak_in(client, voice.id)
    if audio:
        assert decode(audio)[0] == 24000 and decode(audio)[1] > 0

    async def realtime() -> list[dict]:
        errors = []
        async with async_client(url, KEY).realtime.connect(model="tts") as conn:
            await next_event(conn)
            for voice_id in (voice.id, "voice_unknown"):
                await conn.send_raw(json.dumps({"type": "session.update", "session": {
                    "type": "realtime", "audio": {"output": {"voice": {"id": voice_id}}}}}))
                event = await next_event(conn)
                if event["type"] == "error":
                    errors.append(event["error"])
                else:
                    assert event["type"] == "session.updated"
                    assert event["session"]["audio"]["output"]["voice"] == {"id": voice_id}
            await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "ryan"}}})
            assert (await until(conn, "session.updated"))["session"]["audio"]["output"]["voice"] == "ryan"
        return errors

    errors = asyncio.run(realtime())
    assert errors[-1]["param"] == "session.audio.output.voice" and "No custom voice found" in errors[-1]["message"]
    if not audio:  # a model that does not clone refuses the stored voice by name
        assert len(errors) == 2 and "cannot speak in a custom voice" in errors[0]["message"]


def test_a_voice_survives_a_restart(tmp_path: Path) -> None:
    args = ("--model", "tiny-tts", "--data-dir", str(tmp_path / "data"), "--api-key", KEY)
    with serve(*args) as served:
        client = OpenAI(base_url=served.url.rstrip("/") + "/v1", api_key=KEY, max_retries=0, timeout=120)
        consent = client.audio.voice_consents.create(recording=wav(2.0), name="me", language="en-US")
        voice = client.audio.voices.create(audio_sample=mp3(3.0), consent=consent.id, name="kept")
        before = speak_in(client, voice.id)
    assert (tmp_path / "data" / "voices.sqlite3").is_file()
    with serve(*args) as served:
        client = OpenAI(base_url=served.url.rstrip("/") + "/v1", api_key=KEY, max_retries=0, timeout=120)
        assert client.get(f"/audio/voices/{voice.id}", cast_to=object)["name"] == "kept"
        assert client.audio.voice_consents.retrieve(consent.id).name == "me"
        assert speak_in(client, voice.id) == before
        with pytest.raises(openai.NotFoundError):
            client.audio.speech.create(model="tts-1", input="Hello", voice={"id": "voice_never_made"})
