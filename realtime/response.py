"""One response: pipeline events in, Realtime server events out, in the order OpenAI sends them.

response.created -> output_item.added -> conversation.item.added -> content_part.added ->
output_audio.delta / output_audio_transcript.delta (or output_text.delta) ... -> *.done ->
content_part.done -> conversation.item.done -> output_item.done -> response.done -> rate_limits.updated.
A reply that is a tool call becomes function_call items (with function_call_arguments.delta/done)."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from pipelines.types import AudioChunk, Event, TextDelta, TurnDone, TurnError

from .audio import AudioFormat, OutputEncoder, TimeStretch
from .items import Conversation, Item
from .protocol import new_id

REQUEST_CODES = ("invalid_request", "context_too_long")  # pipeline error codes the request caused


@dataclass
class Response:
    send: Callable[[dict], None]
    conversation: Conversation | None  # None: out of band (conversation "none")
    modality: str  # "audio" or "text"
    output_format: AudioFormat
    voice: str
    max_output_tokens: int | str
    metadata: dict | None = None
    started: float = field(default_factory=time.perf_counter)  # for time to first audio
    id: str = field(default_factory=lambda: new_id("resp"))
    turn_id: str | None = None
    status: str = "in_progress"
    reason: str | None = None
    error: dict | None = None
    items: list[Item] = field(default_factory=list)
    transcript: str = ""
    first_audio_s: float | None = None
    timings: dict[str, float] = field(default_factory=dict)  # the engine's, from TurnDone (pipelines.types)
    audio_samples: int = 0
    cancel_reason: str | None = None
    on_audio_start: Callable[[float], None] | None = None
    on_cap: Callable[[], None] | None = None  # stops the turn once max_output_tokens is spent
    text_tokens: int = 0  # output sent so far, what max_output_tokens counts: text tokens + audio frames
    frames: int = 0
    capped: bool = False
    speed: float = 1.0  # audio.output.speed: the audio is time-scaled, its pitch kept
    rate: int = 0  # Hz of the model's audio (its output rate)

    @property
    def audio_ms(self) -> int:
        """Of the model's audio sent so far (before the time-scaling)."""
        return self.audio_samples * 1000 // self.rate if self.rate else 0

    def shell(self) -> dict:
        out = {"id": self.id, "object": "realtime.response", "status": self.status,
               "status_details": None, "output": [i.data for i in self.items],
               "conversation_id": "conv_default" if self.conversation is not None else None,
               "output_modalities": [self.modality], "max_output_tokens": self.max_output_tokens,
               "audio": {"output": {"format": self.output_format.to_config(), "voice": self.voice}},
               "metadata": self.metadata, "usage": None}
        if self.status != "in_progress":
            details = {"type": self.status, "reason": self.reason}
            if self.error:
                details["error"] = self.error
            out["status_details"] = details
        return out

    def created(self) -> None:
        self.send({"type": "response.created", "response": self.shell()})

    async def run(self, events: AsyncIterator[Event]) -> None:
        message: Item | None = None
        speaks = self.rate > 0  # a model that does not speak sends no audio to encode
        encoder = OutputEncoder(self.output_format, self.rate) if speaks else None
        stretch = TimeStretch(self.speed, self.rate) if speaks and self.speed != 1 else None
        async for event in events:
            if self.capped and isinstance(event, TextDelta | AudioChunk):
                continue
            if isinstance(event, TextDelta):
                if not self._spend(len(event.token_ids)):
                    continue
                self.text_tokens += len(event.token_ids)
                if event.tool_call:  # the call's text: its items are made from TurnDone.tool_calls
                    continue
                message = message or self._open_message()
                if event.text:
                    self.transcript += event.text
                    kind = "response.output_audio_transcript.delta" if self.modality == "audio" else \
                        "response.output_text.delta"
                    self.send({"type": kind, **self._where(message), "delta": event.text})
            elif isinstance(event, AudioChunk):
                new = event.frames - self.frames
                pcm = event.pcm
                if new > 0 and not self._spend(new):
                    keep = self._left()
                    pcm, new = pcm[: len(pcm) * keep // new], keep
                    self._cap()
                self.frames += max(new, 0)
                pcm = stretch.push(pcm) if stretch else pcm
                if not len(pcm):
                    continue
                message = message or self._open_message()
                data = encoder.push(pcm)
                if self.first_audio_s is None:
                    self.first_audio_s = time.perf_counter() - self.started
                    if self.on_audio_start:
                        self.on_audio_start(self.first_audio_s)
                self.audio_samples += len(pcm)
                self._audio_delta(message, data)
            elif isinstance(event, TurnDone):
                self.timings = event.timings
                rest = stretch.flush() if stretch else np.zeros(0, np.float32)
                self.audio_samples += len(rest) if message is not None else 0
                tail = encoder.push(rest) + encoder.flush() if encoder else b""
                if tail and message is not None:
                    self._audio_delta(message, tail)
                if event.tool_calls or event.invalid_tool_calls:
                    self._tool_calls(event)
                elif message is None:
                    message = self._open_message()
                self._finish(event, message)
                return
            elif isinstance(event, TurnError):
                if message is not None:
                    self._close_message(message, "incomplete")
                self.fail(event.message, event.code)
                return

    def _audio_delta(self, message: Item, data: bytes) -> None:
        message.audio_ms = self.audio_ms
        self.send({"type": "response.output_audio.delta", **self._where(message),
                   "delta": base64.b64encode(data).decode()})

    def _left(self) -> int:
        limit = self.max_output_tokens
        return 1 << 62 if limit == "inf" else int(limit) - self.text_tokens - self.frames

    def _spend(self, n: int) -> bool:
        """Whether `n` more output tokens fit; once the budget is spent the turn is stopped."""
        left = self._left()
        if n >= left:
            self._cap()
        return n <= left

    def _cap(self) -> None:
        if not self.capped:
            self.capped = True
            if self.on_cap:
                self.on_cap()

    def fail(self, message: str, code: str = "server_error") -> None:
        """Ends the response as failed, whatever its state; a failure in REQUEST_CODES is the client's error."""
        kind = "invalid_request_error" if code in REQUEST_CODES else "server_error"
        self.status, self.error = "failed", {"type": kind, "code": code, "message": message}
        self._done(None)

    def _open_message(self) -> Item:
        item = Item({"id": new_id("item"), "object": "realtime.item", "type": "message", "role": "assistant",
                     "status": "in_progress", "content": []}, turn_id=self.turn_id, speed=self.speed)
        self._add_item(item)
        self.send({"type": "response.content_part.added", **self._where(item), "part": self._part(item, "")})
        return item

    def _part(self, item: Item, text: str) -> dict:
        """The content part as the response events name it; the item holds it as output_audio / output_text."""
        part = {"type": "audio", "transcript": text} if self.modality == "audio" else {"type": "text", "text": text}
        item.data["content"] = [{**part, "type": f"output_{part['type']}"}]
        return part

    def _add_item(self, item: Item) -> None:
        self.items.append(item)
        self.send({"type": "response.output_item.added", "response_id": self.id, "output_index": len(self.items) - 1,
                   "item": item.data})
        if self.conversation is not None:
            prev = self.conversation.insert(item)
            self.send({"type": "conversation.item.added", "previous_item_id": prev, "item": item.data})

    def _where(self, item: Item) -> dict:
        return {"response_id": self.id, "item_id": item.id, "output_index": self.items.index(item), "content_index": 0}

    def _close_message(self, item: Item, status: str) -> None:
        where = self._where(item)
        if self.modality == "audio":
            self.send({"type": "response.output_audio.done", **where})
            self.send({"type": "response.output_audio_transcript.done", **where, "transcript": self.transcript})
        else:
            self.send({"type": "response.output_text.done", **where, "text": self.transcript})
        self.send({"type": "response.content_part.done", **where, "part": self._part(item, self.transcript)})
        self._close_item(item, status)

    def _close_item(self, item: Item, status: str) -> None:
        item.data["status"] = status
        if self.conversation is not None:
            self.send({"type": "conversation.item.done", "item": item.data})
        self.send({"type": "response.output_item.done", "response_id": self.id,
                   "output_index": self.items.index(item), "item": item.data})

    def _tool_calls(self, done: TurnDone) -> None:
        for call in done.tool_calls:
            item = Item({"id": new_id("item"), "object": "realtime.item", "type": "function_call",
                         "status": "in_progress", "name": call.name, "call_id": new_id("call"), "arguments": ""},
                        turn_id=self.turn_id)
            self._add_item(item)
            where = {"response_id": self.id, "item_id": item.id, "output_index": self.items.index(item),
                     "call_id": item.data["call_id"]}
            self.send({"type": "response.function_call_arguments.delta", **where, "delta": call.arguments})
            item.data["arguments"] = call.arguments
            self.send({"type": "response.function_call_arguments.done", **where, "name": call.name,
                       "arguments": call.arguments})
            self._close_item(item, "completed")
        if done.invalid_tool_calls:
            bad = done.invalid_tool_calls[0]
            self.error = {"type": "invalid_tool_call", "code": "invalid_tool_call",
                          "message": f"the model wrote a tool call that is not valid JSON: {bad}"}

    def _finish(self, done: TurnDone, message: Item | None) -> None:
        if done.status == "cancelled" and not (self.capped and self.cancel_reason is None):
            self.status, self.reason = "cancelled", self.cancel_reason or "client_cancelled"
        elif done.status == "length" or self.capped:
            self.status, self.reason = "incomplete", "max_output_tokens"
        elif self.error:
            self.status = "failed"
        else:
            self.status = "completed"
        if message is not None:
            self._close_message(message, "completed" if self.status == "completed" else "incomplete")
        self._done(done)

    def _done(self, done: TurnDone | None) -> None:
        shell = self.shell()
        if done is not None:
            u = done.usage
            text_out, audio_out = (self.text_tokens, self.frames) if self.capped else (u.output_tokens, u.audio_frames)
            shell["usage"] = {
                "total_tokens": u.input_tokens + text_out + audio_out,
                "input_tokens": u.input_tokens, "output_tokens": text_out + audio_out,
                "input_token_details": {"cached_tokens": u.cached_tokens,
                                        "text_tokens": u.input_tokens - u.audio_input_tokens,
                                        "audio_tokens": u.audio_input_tokens},
                "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out},
            }
        self.send({"type": "response.done", "response": shell})
        self.send({"type": "rate_limits.updated", "rate_limits": [
            {"name": "requests", "limit": 1_000_000, "remaining": 1_000_000, "reset_seconds": 0.0},
            {"name": "tokens", "limit": 1_000_000_000, "remaining": 1_000_000_000, "reset_seconds": 0.0},
        ]})
