"""Input transcription by the model itself: a background turn per committed user audio item, its text streamed."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pipelines.pipeline import Pipeline
from pipelines.types import GenerationOptions, Message, TextDelta, Turn, TurnDone, TurnError

from .items import Item
from .protocol import clip, new_id

log = logging.getLogger(__name__)
PROMPT = "Transcribe the user's speech exactly, in its language. Reply with the transcript only."


async def transcribe(pipeline: Pipeline, send: Callable[[dict], None], item: Item, max_tokens: int) -> None:
    """Deltas, then `completed` (the item's transcript set) or `failed` with the engine's error."""
    opts = GenerationOptions(audio=False, background=True, max_text_tokens=max_tokens)
    turn = Turn(new_id("asr"), [Message("system", PROMPT), Message("user", "", item.audio)], opts)
    event = "conversation.item.input_audio_transcription"
    text, failed = "", None
    try:
        async for ev in pipeline.submit(turn):
            if isinstance(ev, TurnError):
                failed = {"type": "server_error", "code": ev.code, "message": clip(ev.message, 500)}
            if isinstance(ev, TextDelta) and ev.text:
                text += ev.text
                send({"type": f"{event}.delta", "item_id": item.id, "content_index": 0, "delta": ev.text})
            elif isinstance(ev, TurnDone):
                item.data["content"][0]["transcript"] = text
                u = ev.usage
                usage = {"type": "tokens", "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                         "input_token_details": {"text_tokens": u.input_tokens - u.audio_input_tokens,
                                                 "audio_tokens": u.audio_input_tokens},
                         "total_tokens": u.input_tokens + u.output_tokens}
                send({"type": f"{event}.completed", "item_id": item.id, "content_index": 0, "transcript": text,
                      "usage": usage})
    except Exception as e:
        log.exception("transcription of %s failed", item.id)
        failed = {"type": "server_error", "code": "server_error", "message": clip(str(e), 500)}
    finally:
        pipeline.end_session(turn.session_id)
    if failed is not None:
        send({"type": f"{event}.failed", "item_id": item.id, "content_index": 0, "error": failed})
