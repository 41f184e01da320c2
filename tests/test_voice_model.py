"""`--voice-model`: Qwen3-Omni's audio encoder and thinker write the reply, Qwen3-TTS's talker and codec speak it,
reading the thinker's tokens as they are made (tiny random models, the real server on loopback, the openai SDK).

What holds by construction, and is tested: the voice's codes equal Qwen3-TTS's own streamed-text mode (the mode
Base reads in) run on the same token ids after the thinker has finished, greedy. Run on the reply's *text*, the
TTS model re-tokenizes it, so the two agree exactly when the text re-tokenizes to the thinker's ids (the reply
tested here does; a reply written in unusual tokens may not). CustomVoice reads a whole text in one prefill by
default, which a reply still being written cannot be: its voice always reads streamed."""

from __future__ import annotations

import asyncio
import base64
import json
import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import torch
from openai import OpenAI

from models.registry import build_pipeline, describe
from pipelines.pipeline import Pipeline
from pipelines.types import AudioChunk, Event, GenerationOptions, Message, TextDelta, Turn, TurnDone, TurnError
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.audio_files import encode_file, tone
from tests.cli_run import run_cli
from tests.contract import live, options, outcome, together, user
from tests.realtime_server import client as async_client
from tests.realtime_server import next_event, running, until
from tests.serve_process import serve

LIMITS = Limits(max_text_tokens=8, max_frames=12)
BASE = "tiny-tts-base"  # the tiny preset's config as a Base checkpoint, registered here for the tests
QUESTION = "Hello there, how are you?"


def consent_and_voice(client: OpenAI) -> str:
    consent = client.audio.voice_consents.create(
        recording=("consent.wav", encode_file(tone(2.0), 24000, "wav", "pcm_s16le"), "audio/wav"),
        name="me", language="en-US")
    sample = ("s.wav", encode_file(tone(3.0, 24000, 140.0), 24000, "wav", "pcm_s16le"), "audio/wav")
    return client.audio.voices.create(audio_sample=sample, consent=consent.id, name="v").id


@pytest.fixture(scope="module")
def voiced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAI, str, Pipeline]]:
    pipeline = build_pipeline("tiny", voice_model="tiny-tts")
    cfg = ServerConfig(data_dir=tmp_path_factory.mktemp("data"), limits=LIMITS)
    with pipeline, running(pipeline, cfg) as (url, _):
        yield OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300), url, pipeline


@pytest.fixture(scope="module")
def base_voice() -> Iterator[None]:
    from models.qwen3_tts.tiny import PRESETS, tiny_config

    PRESETS[BASE] = lambda: tiny_config("base")
    yield
    del PRESETS[BASE]


async def respond(conn, modality: str) -> tuple[dict, list[dict]]:
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": QUESTION}]})
    await conn.response.create(response={"output_modalities": [modality]})
    seen: list[dict] = []
    while not seen or seen[-1]["type"] != "response.done":
        seen.append(await next_event(conn))
        assert seen[-1]["type"] != "error", seen[-1]
    return seen[-1]["response"], seen


def test_models_reports_the_voice_models_voices_and_speech_is_refused_clearly(voiced) -> None:
    client, _, pipeline = voiced
    served = client.get("/models", cast_to=object)["data"][0]["capabilities"]
    tts = describe("tiny-tts")
    assert served == describe("tiny", "tiny-tts").capabilities() == pipeline.spec.capabilities()
    assert served["voices"] == list(tts.voices) and served["default_voice"] == "vivian" == tts.default_voice
    assert served["languages"] == list(tts.languages) and served["output_rate"] == 24000 == tts.output_rate
    assert served["audio_in"] and served["text_out"] and served["tools"] and served["input_rate"] == 16000
    assert not served["voice_cloning"] and not served["speech"]  # a CustomVoice clones nothing; no read-aloud turn
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model="qwen3-omni", input="Hello", voice="vivian")
    assert e.value.body["code"] == "model_not_supported" and "does not read text aloud" in e.value.body["message"]


def test_a_realtime_turn_in_a_named_speaker_and_custom_voices_refused(voiced) -> None:
    client, url, _ = voiced
    voice_id = consent_and_voice(client)

    async def go() -> tuple[dict, list[dict], str, list[dict]]:
        errors = []
        async with async_client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            for voice in ("ethan", {"id": voice_id}):  # Omni's own voice is not served; a CustomVoice cannot clone
                await conn.send_raw(json.dumps({"type": "session.update", "session": {
                    "type": "realtime", "audio": {"output": {"voice": voice}}}}))
                errors.append((await until(conn, "error"))["error"])
            await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "ryan"}}})
            assert (await until(conn, "session.updated"))["session"]["audio"]["output"]["voice"] == "ryan"
            done, seen = await respond(conn, "audio")
        async with async_client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            text_done, text_seen = await respond(conn, "text")
        text = "".join(e["delta"] for e in text_seen if e["type"] == "response.output_text.delta")
        return done, seen, text, errors

    done, seen, text, errors = asyncio.run(go())
    assert "unknown voice 'ethan'" in errors[0]["message"] and "ryan" in errors[0]["message"]
    assert "cannot speak in a custom voice" in errors[1]["message"]
    audio = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.output_audio.delta")
    transcript = "".join(e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta")
    content = done["output"][0]["content"][0]
    assert done["status"] == "incomplete" and done["status_details"]["reason"] == "max_output_tokens"
    assert done["audio"]["output"]["voice"] == "ryan"
    assert transcript and content["transcript"] == transcript == text  # the transcript is the thinker's greedy text
    frames = done["usage"]["output_token_details"]["audio_tokens"]
    assert 0 < frames <= LIMITS.max_frames and len(audio) == frames * 1920 * 2  # 24 kHz PCM16 on the wire


def test_the_voice_reads_only_a_vocabulary_it_shares(voiced) -> None:
    from models.common.tokenizer import Tokenizer

    voice = voiced[2].program.voice
    vocab = Tokenizer.builtin().backend.get_vocab(with_added_tokens=True)
    voice.reads(vocab)  # the thinker's own: the same Qwen vocabulary
    for changed, words in (({"hello": vocab["hello"] + 1}, "the tokenizers differ: 'hello'"),
                           ({"<|im_end|>": 7}, "the reply ends at token 7")):
        with pytest.raises(ValueError, match=words):
            voice.reads({**vocab, **changed})


def test_the_speaker_chooses_the_voice(voiced) -> None:
    _, _, pipeline = voiced
    opts = dict(greedy=True, max_text_tokens=6, max_frames=6)
    codes = {v: pipeline.run(Turn(f"speaker-{v}", [Message("user", QUESTION)], GenerationOptions(voice=v, **opts)))[-1]
             for v in ("vivian", "ryan")}
    assert codes["vivian"].text_ids == codes["ryan"].text_ids and len(codes["vivian"].codes) == 6
    assert codes["vivian"].codes != codes["ryan"].codes
    for session in codes:
        pipeline.end_session(f"speaker-{session}")
    stats = pipeline.stats()  # the voice's stream slots and talker cache are given back
    assert stats["stream_slots"] == {"talker": 0, "code2wav": 0} and stats["turns_active"] == 0
    assert stats["kv_blocks"]["talker"] == 0


def test_batched_turns_equal_each_alone_and_free_everything(voiced) -> None:
    """As the model contract asks of every preset (tests/test_contract.py), for Omni with a TTS voice: audio-in turns
    of different lengths, greedy, alone and all at once."""
    pipeline = voiced[2]
    spec, before = pipeline.spec, live(pipeline)
    texts = ("Hello!", "What is the weather like in Paris today?", "Tell me a story about a fox and a crow.")

    def turns() -> list[Turn]:
        return [Turn(f"b{i}", [user(spec, text, 0.5 + 0.4 * i, seed=i)], options(spec, max_text_tokens=6,
                                                                                  max_frames=8))
                for i, text in enumerate(texts)]

    alone = [outcome(pipeline.run(t, timeout_s=120)) for t in turns()]
    for t in turns():
        pipeline.end_session(t.session_id)
    batched = [outcome(events) for events in together(pipeline, turns())]
    for t in turns():
        pipeline.end_session(t.session_id)
    for a, b in zip(alone, batched, strict=True):
        assert a.same_tokens(b) and len(a.codes) == 8
        np.testing.assert_allclose(a.pcm, b.pcm, atol=5e-3)  # the codec's batched convolutions round differently
    assert live(pipeline) == before and not any(pipeline.kv_check().values())


def test_the_voice_equals_the_tts_model_reading_the_final_text_streamed(base_voice) -> None:
    """Greedy: the voice reads the thinker's tokens as they come; the TTS model alone reads the reply's text after
    the fact, in its streamed mode (Base), with the same reference voice: the same codes and waveform. Midway, a
    second session's prompt takes one thinker step: the talker, a token ahead then, must wait for the next one."""
    from models.common.tokenizer import Tokenizer
    from models.qwen3_tts.program import build
    from models.qwen3_tts.prompt import TextIds

    reference = torch.from_numpy(tone(2.0, 24000, 170.0))
    opts = dict(greedy=True, max_frames=30, reference_audio=reference)
    with _composed(BASE) as pipeline:
        assert pipeline.spec.clones and pipeline.spec.voices == ("default",)
        arrived: queue.Queue[Event] = queue.Queue()
        other = Turn("other", [Message("user", "Why?")], GenerationOptions(audio=False, max_text_tokens=2))

        def emit(event: Event) -> None:
            arrived.put(event)
            if isinstance(event, AudioChunk) and event.frames == 6:
                pipeline.call(lambda: pipeline.program.start_turn(other, lambda e: None))

        turn = Turn("eq", [Message("user", QUESTION)], GenerationOptions(max_text_tokens=16, **opts))
        pipeline.call(lambda: pipeline.program.start_turn(turn, emit))
        events = [arrived.get(timeout=120)]
        while not isinstance(events[-1], TurnDone | TurnError):
            events.append(arrived.get(timeout=120))
    done = events[-1]
    assert isinstance(done, TurnDone) and done.status == "length" and len(done.text_ids) == 16
    first_audio = next(i for i, e in enumerate(events) if isinstance(e, AudioChunk))
    last_text = max(i for i, e in enumerate(events) if isinstance(e, TextDelta) and e.token_ids)
    assert first_audio < last_text, "the voice waited for the whole reply"
    assert TextIds.of(Tokenizer.builtin(), done.text).text == list(done.text_ids), "the text re-tokenizes otherwise"
    with build(BASE) as tts:
        alone = tts.run(Turn("tts", [Message("user", done.text)], GenerationOptions(**opts)))
    assert isinstance(alone[-1], TurnDone) and len(alone[-1].codes) > 2
    assert done.codes == alone[-1].codes
    pcm = [np.concatenate([e.pcm for e in evs if isinstance(e, AudioChunk)]) for evs in (events, alone)]
    np.testing.assert_array_equal(pcm[0], pcm[1])


def _composed(voice: str):
    from models.qwen3_omni.program import build
    from models.qwen3_tts.voice import build_voice

    return build("tiny", voice=build_voice(voice))


def test_a_custom_voice_in_realtime_with_a_base_voice_model(base_voice, tmp_path: Path) -> None:
    with _composed(BASE) as pipeline, running(pipeline, ServerConfig(data_dir=tmp_path, limits=LIMITS)) as (url, _):
        client = OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
        voice_id = consent_and_voice(client)

        async def go() -> tuple[dict, bytes]:
            async with async_client(url).realtime.connect(model="qwen3-omni") as conn:
                await next_event(conn)
                await conn.send_raw(json.dumps({"type": "session.update", "session": {
                    "type": "realtime", "audio": {"output": {"voice": {"id": voice_id}}}}}))
                await until(conn, "session.updated")
                done, seen = await respond(conn, "audio")
            return done, b"".join(base64.b64decode(e["delta"]) for e in seen
                                  if e["type"] == "response.output_audio.delta")

        done, audio = asyncio.run(go())
    # a Base voice speaks only in a cloned voice: the stored sample reached its speaker encoder
    assert done["audio"]["output"]["voice"] == voice_id and len(audio) > 0


def test_serve_with_a_voice_model_and_its_errors_in_one_line() -> None:
    with serve("--model", "tiny", "--voice-model", "tiny-tts") as served:
        client = OpenAI(base_url=served.url.rstrip("/") + "/v1", api_key="none", max_retries=0, timeout=60)
        assert client.get("/models", cast_to=object)["data"][0]["capabilities"]["voices"][0] == "vivian"
    for voice, words in (("/no/such/dir", ("--voice-model /no/such/dir", "no such directory")),
                         ("tiny", ("--voice-model tiny", "cannot be another model's voice"))):
        r = run_cli("serve", "--port", "0", "--model", "tiny", "--voice-model", voice)  # main, in this process
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and all(w in lines[0] for w in words), r.stderr
