"""The model contract over Realtime, for every registered model's tiny preset: one text turn through the real
server on loopback with the official openai SDK, every server event validated against the SDK's types. A
model that speaks answers in audio; one that does not answers in text, and a request for audio from it gets
a clear error, not a crash."""

from __future__ import annotations

import asyncio
import base64

import pytest

from models import registry
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import client, next_event, running, until

LIMITS = Limits(max_text_tokens=6, max_frames=4)
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
HELLO = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello, who are you?"}]}


@pytest.fixture(scope="module", params=registry.presets())
def served(request):
    with registry.build_pipeline(request.param) as p, \
            running(p, ServerConfig(model_name=p.spec.name, limits=LIMITS)) as (url, _):
        yield p.spec, url


async def reply(conn, response: dict | None = None) -> tuple[dict, list[dict]]:
    """Answer a new user message; (response.done's response, every event up to it). No error may come."""
    await conn.conversation.item.create(item=HELLO)
    if response is None:
        await conn.response.create()
    else:
        await conn.response.create(response=response)
    seen: list[dict] = []
    while not seen or seen[-1]["type"] != "response.done":
        seen.append(await next_event(conn))
        assert seen[-1]["type"] != "error", seen[-1]
    return seen[-1]["response"], seen


def test_one_realtime_turn_with_the_openai_sdk(served):
    spec, url = served
    modality = "audio" if spec.speaks else "text"

    async def go():
        async with client(url).realtime.connect(model=spec.name) as conn:
            created = await next_event(conn)
            assert created["type"] == "session.created"
            await conn.session.update(session={**MANUAL, "output_modalities": [modality]})
            updated = await until(conn, "session.updated")
            assert updated["session"]["output_modalities"] == [modality]
            done, seen = await reply(conn)
            assert done["status"] in ("completed", "incomplete") and done["output_modalities"] == [modality]
            content = done["output"][0]["content"][0]
            usage = done["usage"]["output_token_details"]
            kinds = {e["type"] for e in seen}
            if spec.speaks:
                assert "response.output_text.delta" not in kinds
                transcript = "".join(e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta")
                assert content["type"] == "output_audio" and content["transcript"] == transcript and transcript
                audio = b"".join(base64.b64decode(e["delta"]) for e in seen
                                 if e["type"] == "response.output_audio.delta")
                frames, per_frame = usage["audio_tokens"], spec.frame_ms * 24  # PCM16 at 24 kHz on the wire
                assert frames > 0 and (frames - 1) * per_frame < len(audio) // 2 <= frames * per_frame
            else:
                assert not any(k.startswith("response.output_audio") for k in kinds), kinds
                text = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
                assert content["type"] == "output_text" and content["text"] == text and text
                assert usage["audio_tokens"] == 0 and usage["text_tokens"] > 0

    asyncio.run(go())


def test_audio_only_from_a_model_that_speaks_and_text_from_any(served):
    """A response in text is served by any model that writes text; one in audio from a model that does not
    speak (or one in text from a model that only speaks) is refused with a clear error, and the session goes on."""
    spec, url = served

    async def go():
        async with client(url).realtime.connect(model=spec.name) as conn:
            await next_event(conn)
            await conn.session.update(session=MANUAL)
            await until(conn, "session.updated")
            await conn.conversation.item.create(item=HELLO)
            if not spec.speaks:
                await conn.response.create(response={"output_modalities": ["audio"]})
                seen: list[dict] = []
                while not seen or seen[-1]["type"] not in ("response.done", "error"):
                    seen.append(await next_event(conn))
                last = seen[-1]  # refused as the request arrives (an error event), or as its turn starts
                if last["type"] == "error":
                    error = last["error"]
                    assert error["code"] in ("invalid_value", "invalid_request_error", "invalid_request"), error
                    assert error.get("param") in (None, "response.output_modalities"), error
                else:
                    assert last["response"]["status"] == "failed", last
                    error = last["response"]["status_details"]["error"]
                    assert error["code"] == "invalid_request", error
                assert "text" in error["message"], error
            done, seen = await reply(conn, {"output_modalities": ["text"]})
            if not spec.text_out:  # a model that only reads aloud writes no text reply: refused clearly
                assert done["status"] == "failed", done
                error = done["status_details"]["error"]
                assert error["code"] == "invalid_request" and "audio" in error["message"], error
                return
            assert done["status"] in ("completed", "incomplete") and done["output_modalities"] == ["text"]
            assert not any(e["type"].startswith("response.output_audio") for e in seen)
            text = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
            assert text and done["output"][0]["content"][0]["text"] == text

    asyncio.run(go())
