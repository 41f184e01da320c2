"""GA protocol gaps that real clients hit: strict values, the valid GA fields, transcription sessions,
output bounded over text and audio, the idle timeout, cancel by id. The real server on loopback, the tiny
model; every server event is validated against the openai SDK's types (tests/realtime_server.next_event),
which are also the oracle for the client events (SessionUpdateEvent)."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from openai.types.realtime import ResponseCreateEvent, SessionUpdateEvent
from pydantic import ValidationError

from benchmarks.turn_corpus import available, utterance
from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import append_audio, client, next_event, pcm16_b64, running, until
from tests.speech import speech_in_silence, speech_like

LIMITS = Limits(max_text_tokens=10, max_frames=8, transcription_tokens=12)
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


def nested(path: str, value) -> dict:
    """{"a": {"b": value}} for "a.b"."""
    out = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


# (field under `session`, value, whether the SDK's own types reject it; False: a GA range they do not check)
INVALID = [
    ("audio.input.noise_reduction", {"type": "bogus"}, True),
    ("audio.input.noise_reduction", {"type": "far_field", "strength": "max"}, True),
    ("audio.output.speed", 99, False),
    ("audio.output.speed", 0.1, False),
    ("audio.output.speed", "fast", True),
    ("tracing", 123, True),
    ("truncation", "bogus", True),
    ("truncation", {"type": "retention_ratio", "retention_ratio": 2}, False),
    ("audio.input.transcription", 42, True),
    ("audio.input.transcription", {"model": "x", "delay": "forever"}, True),
    ("audio.input.format", "pcm16", True),
    ("audio.output.format", "g711_ulaw", True),
    ("reasoning", {"effort": "bogus"}, True),
    ("reasoning", "high", True),
    ("parallel_tool_calls", "yes", False),  # pydantic coerces "yes"; GA wants a boolean
    ("parallel_tool_calls", 3, True),
    ("include", ["bogus"], True),
    ("prompt", 5, True),
    ("max_output_tokens", 0, False),
    ("output_modalities", ["video"], True),
]
VALID = [
    ("reasoning", {"effort": "low"}),
    ("reasoning", None),
    ("parallel_tool_calls", False),
    ("audio.input.noise_reduction", {"type": "far_field"}),
    ("audio.input.noise_reduction", {"type": "near_field", "strength": 0.5}),
    ("audio.output.speed", 1.25),
    ("truncation", "disabled"),
    ("truncation", {"type": "retention_ratio", "retention_ratio": 0.5}),
    ("prompt", {"id": "pmpt_1", "version": "2", "variables": {"city": "Paris"}}),
    ("include", ["item.input_audio_transcription.logprobs"]),
    ("audio.input.transcription", {"model": "gpt-4o-transcribe", "language": "en", "keywords": ["omni"],
                                   "delay": "low"}),
    ("tracing", "auto"),
    ("max_output_tokens", 32),
]


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline("tiny") as p:
        yield p


@pytest.fixture(scope="module")
def server(pipeline):
    with running(pipeline, ServerConfig(max_sessions=10, limits=LIMITS)) as (url, srv):
        yield url, srv


def test_invalid_values_are_refused_by_name_and_valid_ga_fields_accepted(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session=MANUAL)
            before = (await until(conn, "session.updated"))["session"]
            for path, value, sdk_rejects in INVALID:
                update = {"type": "realtime", **nested(path, value)}
                if sdk_rejects:
                    with pytest.raises(ValidationError):
                        SessionUpdateEvent.model_validate({"type": "session.update", "session": update})
                await conn.send_raw(json.dumps({"type": "session.update", "session": update}))
                error = (await until(conn, "error"))["error"]
                assert error["type"] == "invalid_request_error" and error["code"] == "invalid_value", (path, error)
                assert error["param"] == f"session.{path}", (path, error)
            await conn.session.update(session={"type": "realtime"})
            assert (await until(conn, "session.updated"))["session"] == before  # nothing was applied
            for path, value in VALID:
                update = {"type": "realtime", **nested(path, value)}
                SessionUpdateEvent.model_validate({"type": "session.update", "session": update})
                await conn.send_raw(json.dumps({"type": "session.update", "session": update}))
                event = await next_event(conn)  # validated against the SDK's GA session types
                assert event["type"] == "session.updated", (path, event)
                got = event["session"]
                for key in path.split("."):
                    got = got[key]
                assert got == value, (path, got)
            # the same fields per response; a response with them runs
            for bad, param in (({"reasoning": {"effort": 3}}, "response.reasoning"),
                               ({"parallel_tool_calls": 7}, "response.parallel_tool_calls")):
                with pytest.raises(ValidationError):
                    ResponseCreateEvent.model_validate({"type": "response.create", "response": bad})
                await conn.send_raw(json.dumps({"type": "response.create", "response": bad}))
                assert (await until(conn, "error"))["error"]["param"] == param
            spec = {"reasoning": {"effort": "minimal"}, "parallel_tool_calls": False, "output_modalities": ["text"],
                    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]}
            ResponseCreateEvent.model_validate({"type": "response.create", "response": spec})
            await conn.send_raw(json.dumps({"type": "response.create", "response": spec}))
            assert (await until(conn, "response.done"))["response"]["status"] in ("completed", "incomplete")

    asyncio.run(go())


def test_max_output_tokens_bounds_text_and_audio_together(pipeline):
    limits = Limits(max_text_tokens=200, max_frames=400)  # far above the cap: the cap must stop it
    with running(pipeline, ServerConfig(limits=limits)) as (url, _):

        async def go():
            async with client(url).realtime.connect(model="qwen3-omni") as conn:
                await next_event(conn)
                await conn.session.update(session={**MANUAL, "max_output_tokens": 32})
                await until(conn, "session.updated")
                await append_audio(conn, speech_like(0.8))
                await conn.input_audio_buffer.commit()
                await conn.response.create()
                seen: list[dict] = []
                done = (await until(conn, "response.done", seen))["response"]
                assert done["status"] == "incomplete" and done["status_details"]["reason"] == "max_output_tokens"
                audio = b"".join(base64.b64decode(e["delta"]) for e in seen
                                 if e["type"] == "response.output_audio.delta")
                frames = len(audio) / 2 / 1920  # 80 ms codec frames of 24 kHz PCM16 (the last one's tail is held)
                usage = done["usage"]
                text = usage["output_token_details"]["text_tokens"]
                assert usage["output_tokens"] == text + usage["output_token_details"]["audio_tokens"] <= 32
                audio_tokens = usage["output_token_details"]["audio_tokens"]
                assert audio_tokens - 1 < frames <= audio_tokens and audio_tokens > 0 and text > 0
                # the pipeline stopped: the next turn starts at once and the session is not busy
                await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                          "content": [{"type": "input_text", "text": "More."}]})
                await conn.response.create(response={"max_output_tokens": 5, "output_modalities": ["text"]})
                seen = []
                done = (await until(conn, "response.done", seen, timeout=30))["response"]
                assert "error" not in [e["type"] for e in seen]
                assert done["status"] == "incomplete" and done["usage"]["output_tokens"] <= 5

        asyncio.run(go())


async def transcripts(conn, n: int, seen: list[dict]) -> list[dict]:
    """Events until `n` transcriptions have completed or failed; no response may start meanwhile."""
    ends = []
    while len(ends) < n:
        event = await next_event(conn, timeout=60)
        seen.append(event)
        assert not event["type"].startswith("response."), event
        if event["type"].startswith("conversation.item.input_audio_transcription.") and \
                not event["type"].endswith(".delta"):
            ends.append(event)
    return ends


def test_transcription_session_with_server_vad_and_manual_commits(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.send_raw(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 24000}, "noise_reduction": {"type": "near_field"},
                    "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}}))
            session = (await until(conn, "session.updated"))["session"]
            assert session["type"] == "transcription" and "instructions" not in session
            # two utterances, each committed by the VAD and transcribed, never answered
            audio = np.concatenate([speech_in_silence(0.6, 1.0, 0.8, seed=s).audio for s in (1, 2)])
            await append_audio(conn, audio, chunk_s=0.05)
            seen: list[dict] = []
            done = await transcripts(conn, 2, seen)
            committed = [e["item_id"] for e in seen if e["type"] == "input_audio_buffer.committed"]
            assert [e["type"] for e in done] == ["conversation.item.input_audio_transcription.completed"] * 2
            assert [e["item_id"] for e in done] == committed and len(committed) == 2
            for end in done:
                deltas = [e["delta"] for e in seen if e["type"].endswith("transcription.delta")
                          and e["item_id"] == end["item_id"]]
                assert end["transcript"] == "".join(deltas) and end["usage"]["input_tokens"] > 0
            # manual commits; a response is refused; realtime-only fields are unknown here
            await conn.send_raw(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {"turn_detection": None}}}}))
            await until(conn, "session.updated")
            await conn.send_raw(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "instructions": "x"}}))
            assert (await until(conn, "error"))["error"]["param"] == "session.instructions"
            await conn.response.create()
            assert (await until(conn, "error"))["error"]["param"] == "session.type"
            await append_audio(conn, speech_like(0.7, seed=3))
            await conn.input_audio_buffer.commit()
            end, = await transcripts(conn, 1, seen)
            assert end["type"].endswith(".completed")
            # back to a realtime session (the input audio config stays): the conversation is answered again
            await conn.session.update(session={"type": "realtime"})
            session = (await until(conn, "session.updated"))["session"]
            assert session["type"] == "realtime" and session["audio"]["input"]["turn_detection"] is None
            assert session["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
            await conn.response.create()
            assert (await until(conn, "response.done", timeout=60))["response"]["status"] == "incomplete"

    asyncio.run(go())


def test_failed_transcription_sends_failed_and_the_session_goes_on():
    # a thinker cache of 16 blocks (256 tokens): 30 s of speech (~390 audio tokens) cannot be transcribed
    with build_pipeline("tiny", thinker={"kv_blocks": 16}) as small, \
            running(small, ServerConfig(limits=Limits(transcription_tokens=32))) as (url, _):

        async def go():
            async with client(url).realtime.connect(model="qwen3-omni") as conn:
                await next_event(conn)
                await conn.send_raw(json.dumps({"type": "session.update", "session": {
                    "type": "transcription", "audio": {"input": {"turn_detection": None}}}}))
                await until(conn, "session.updated")
                seen: list[dict] = []
                for seconds, kind in ((30.0, ".failed"), (0.8, ".completed")):
                    await append_audio(conn, speech_like(seconds, seed=4), chunk_s=0.5)
                    await conn.input_audio_buffer.commit()
                    end, = await transcripts(conn, 1, seen)
                    assert end["type"].endswith(kind), end.get("error")
                    item = next(e for e in seen if e["type"] == "input_audio_buffer.committed")["item_id"]
                    seen.clear()
                    if kind == ".failed":
                        assert end["item_id"] == item and end["error"]["code"] == "context_too_long", end

        asyncio.run(go())


@pytest.mark.skipif(not available(), reason="needs espeak-ng and sox (.ci/run installs them)")
def test_pipecat_realtime_stt_gets_a_transcript_per_utterance(server):
    """pipecat's OpenAIRealtimeSTTService (a real client, pinned in the test extras) against the server."""
    from pipecat.frames.frames import InputAudioRawFrame, TranscriptionFrame
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.services.openai.stt import OpenAIRealtimeSTTService
    from pipecat.tests.utils import SleepFrame, run_test

    url, _ = server
    stt = OpenAIRealtimeSTTService(api_key="unused", base_url=url.replace("http", "ws") + "/realtime",
                                   settings=OpenAIRealtimeSTTService.Settings(model="gpt-4o-transcribe"),
                                   turn_detection={"type": "server_vad", "silence_duration_ms": 300})
    # espeak-ng speech: Silero stops hearing tests/speech.py's synthetic buzz in a second turn of one stream
    audio = np.concatenate([utterance(s, "whole", lead_ms=600, tail_ms=800).audio for s in (5, 6)])
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    step = 16000 * 2 // 20  # 50 ms
    chunks = [InputAudioRawFrame(audio=pcm[i : i + step], sample_rate=16000, num_channels=1)
              for i in range(0, len(pcm), step)]
    frames = [SleepFrame(sleep=0.5), *chunks, SleepFrame(sleep=3.0)]  # connect; speak; let the transcripts come
    params = PipelineParams(audio_in_sample_rate=16000)
    down, _ = asyncio.run(run_test(stt, frames_to_send=frames, pipeline_params=params, start_timeout=10.0))
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert len(finals) == 2 and all(f.text for f in finals), down


def test_idle_timeout_fires_before_the_first_response_and_after_the_reply_has_played(server):
    url, _ = server
    quiet = np.random.default_rng(1).normal(0, 3e-4, 24000 * 8).astype(np.float32)  # near silence

    async def silence_until_timeout(conn, limit_ms: int) -> tuple[int, dict]:
        """Append 100 ms of near silence at a time until the timeout fires; returns the ms appended."""
        for n in range(1, limit_ms // 100 + 1):
            await conn.input_audio_buffer.append(audio=pcm16_b64(quiet[(n - 1) * 2400 : n * 2400]))
            while True:  # an append is answered by nothing, so ask for an event we can wait on
                await conn.send_raw(json.dumps({"type": "conversation.item.retrieve", "item_id": "none"}))
                event = await next_event(conn)
                while event["type"] != "error":
                    if event["type"] == "input_audio_buffer.timeout_triggered":
                        return n * 100, event
                    assert not event["type"].startswith("input_audio_buffer.speech"), event
                    event = await next_event(conn)
                break
        raise AssertionError(f"no timeout after {limit_ms} ms of silence")

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "server_vad", "idle_timeout_ms": 1000}}}})
            await until(conn, "session.updated")
            heard, event = await silence_until_timeout(conn, 3000)  # no response yet: from the start
            assert 1000 <= heard <= 1200 and event["audio_start_ms"] == 0, (heard, event)
            seen: list[dict] = []
            await until(conn, "response.done", seen)  # the timeout's commit is answered
            played = sum(len(base64.b64decode(e["delta"])) for e in seen
                         if e["type"] == "response.output_audio.delta")
            played_ms = played // 2 * 1000 // 24000
            assert played_ms > 0
            heard, event = await silence_until_timeout(conn, 5000)  # the reply plays first, then 1 s of silence
            # (the VAD judges 30 ms frames: the timer may start up to one frame before the last append's end)
            assert played_ms + 1000 - 30 <= heard <= played_ms + 1200, (heard, played_ms, event)
            assert event["audio_end_ms"] - event["audio_start_ms"] >= 1000

    asyncio.run(go())


def test_cancel_by_id_duplicate_ids_and_retrieve_with_the_users_audio(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session=MANUAL)
            await until(conn, "session.updated")
            speech = speech_like(0.5, seed=7)
            await append_audio(conn, speech)
            await conn.input_audio_buffer.commit()
            item_id = (await until(conn, "input_audio_buffer.committed"))["item_id"]
            # the user's audio comes back, in the session's input format
            await conn.conversation.item.retrieve(item_id=item_id)
            part = (await until(conn, "conversation.item.retrieved"))["item"]["content"][0]
            back = np.frombuffer(base64.b64decode(part["audio"]), "<i2") / 32767
            sent = np.round(np.clip(speech, -1, 1) * 32767) / 32767
            assert abs(len(back) - len(sent)) <= 2
            n = min(len(back), len(sent))
            assert np.sqrt(np.mean((back[:n] - sent[:n]) ** 2)) < 0.1 * np.sqrt(np.mean(sent**2))  # via 16 kHz
            # a duplicate id is refused, and nothing is added
            text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
            await conn.conversation.item.create(item={**text, "id": item_id})
            error = (await until(conn, "error"))["error"]
            assert error["code"] == "invalid_value" and error["param"] == "item.id"
            # response.cancel names the response it cancels (a long text reply, so it is still running)
            await conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": 2000})
            active = (await until(conn, "response.created"))["response"]["id"]
            await conn.response.cancel(response_id="resp_someone_else")
            seen: list[dict] = []
            error = (await until(conn, "error", seen))["error"]
            assert error["code"] == "response_cancel_not_active" and error["param"] == "response_id"
            assert "response.done" not in [e["type"] for e in seen]
            await conn.response.cancel(response_id=active)
            done = (await until(conn, "response.done"))["response"]
            assert done["id"] == active and done["status"] == "cancelled"

    asyncio.run(go())


def test_truncation_drops_the_oldest_items_when_the_context_would_overflow():
    # a thinker cache of 16 blocks (256 tokens) holds about four of these turns
    say = "The quick brown fox jumps over the lazy dog, and then it runs away into the woods. " * 2
    with build_pipeline("tiny", thinker={"kv_blocks": 16}) as small, \
            running(small, ServerConfig(limits=LIMITS)) as (url, _):

        async def turns(truncation) -> list[dict]:
            async with client(url).realtime.connect(model="qwen3-omni") as conn:
                await next_event(conn)
                await conn.session.update(session={**MANUAL, "output_modalities": ["text"], "max_output_tokens": 8,
                                                   "truncation": truncation})
                await until(conn, "session.updated")
                dones = []
                for _ in range(8):
                    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                              "content": [{"type": "input_text", "text": say}]})
                    await conn.response.create()
                    dones.append((await until(conn, "response.done", timeout=60))["response"])
                return dones

        async def go():
            disabled = await turns("disabled")
            failed = [d["status_details"]["error"]["code"] for d in disabled if d["status"] == "failed"]
            assert failed and set(failed) == {"context_too_long"}, [d["status"] for d in disabled]
            for truncation in ("auto", {"type": "retention_ratio", "retention_ratio": 0.5}):
                dones = await turns(truncation)
                assert [d["status"] for d in dones] == ["incomplete"] * 8, truncation  # each ran to its cap
                # the cache was reset and re-read once the context filled: fewer cached tokens than before
                cached = [d["usage"]["input_token_details"]["cached_tokens"] for d in dones]
                assert any(b < a for a, b in zip(cached[1:], cached[2:], strict=False)), cached

        asyncio.run(go())


def test_output_speed_time_scales_the_reply(server):
    url, _ = server

    async def reply(conn, speed: float) -> tuple[int, dict]:
        await conn.session.update(session={"type": "realtime", "audio": {"output": {"speed": speed}}})
        await until(conn, "session.updated")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello."}]})
        await conn.response.create()
        seen: list[dict] = []
        done = (await until(conn, "response.done", seen))["response"]
        audio = sum(len(base64.b64decode(e["delta"])) // 2 for e in seen if e["type"] == "response.output_audio.delta")
        return audio, done

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session=MANUAL)
            await until(conn, "session.updated")
            normal, done = await reply(conn, 1.0)
            frames = done["usage"]["output_token_details"]["audio_tokens"]
            for speed in (1.5, 0.5):
                samples, done = await reply(conn, speed)
                assert done["usage"]["output_token_details"]["audio_tokens"] == frames  # the same frames (the cap)
                assert abs(samples - normal / speed) <= 1, (speed, samples, normal)

    asyncio.run(go())
