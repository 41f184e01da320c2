"""One Realtime session per WebSocket: its config, conversation, input audio buffer, turn detection and
active response, driven by client events and by the pipeline."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipelines.pipeline import Pipeline
from pipelines.types import GenerationOptions, Message, TextDelta, Turn, TurnDone

from . import logs
from .audio import AudioFormat, decode, to_model_rate
from .items import Conversation, Item, item_from_client, to_messages, user_audio_item
from .metrics import Metrics
from .protocol import ProtocolError, default_session, merge_update, new_id, require, speaker_for
from .response import Response
from .vad import IdleTimeout, ServerVad, SpeechStarted, SpeechStopped, VadConfig

log = logging.getLogger(__name__)
MAX_APPEND_BYTES = 15 * 1024 * 1024
MIN_COMMIT_MS = 100


@dataclass(frozen=True)
class Limits:
    max_buffer_s: float = 600.0  # input audio kept before a commit
    max_text_tokens: int = 1024  # for max_output_tokens "inf"
    max_frames: int = 1500  # 2 minutes of speech per response
    transcription_tokens: int = 256


class RealtimeSession:
    def __init__(self, send: Callable[[dict], None], pipeline: Pipeline, model: str, metrics: Metrics,
                 limits: Limits = Limits()) -> None:
        self._send_raw, self.pipeline, self.metrics, self.limits = send, pipeline, metrics, limits
        self.config = default_session(model)
        self.conversation = Conversation()
        self.buffer: list[torch.Tensor] = []  # input audio at the input format's rate
        self.buffer_ms = 0.0
        self.clock_ms = 0.0  # all input audio of the session (the VAD's and the protocol's time line)
        self.vad: ServerVad | None = None
        self.speech_item: str | None = None
        self.response: Response | None = None
        self.task: asyncio.Task | None = None
        self.pipe_session = new_id("pipe")
        self.sent: list[str] = []  # item ids the pipeline session already holds, in order
        self.sent_context: tuple | None = None
        self.committed_at: float | None = None
        self.background: set[asyncio.Task] = set()
        self.respond_after = False
        self._reset_vad()

    def send(self, event: dict) -> None:
        self._send_raw({"event_id": new_id("event"), **event})

    def start(self) -> None:
        self.send({"type": "session.created", "session": self.config})

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        for t in list(self.background):
            t.cancel()
        self.pipeline.end_session(self.pipe_session)

    # -- client events -----------------------------------------------------------------------------
    async def handle(self, raw: str | bytes) -> None:
        event_id = None
        try:
            if isinstance(raw, bytes):
                raise ProtocolError("invalid_event", "Binary frames are not supported; send JSON text events.")
            try:
                event = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ProtocolError("invalid_json", f"Invalid JSON: {e}") from None
            if not isinstance(event, dict):
                raise ProtocolError("invalid_event", "An event must be a JSON object.")
            event_id = event.get("event_id")
            handler = HANDLERS.get(require(event, "type"))
            if handler is None:
                raise ProtocolError("invalid_value", f"Invalid value: '{event['type']}'. Not a client event type.",
                                    "type")
            await handler(self, event)
        except ProtocolError as e:
            self.metrics.error(e.code)
            self.send(e.event(event_id))

    async def session_update(self, event: dict) -> None:
        self.config = merge_update(self.config, require(event, "session", dict))
        self._reset_vad()
        self.send({"type": "session.updated", "session": self.config})

    async def append(self, event: dict) -> None:
        data = require(event, "audio")
        if len(data) > MAX_APPEND_BYTES * 4 // 3 + 4:
            raise ProtocolError("invalid_value", "Audio chunk is larger than 15 MiB.", "audio")
        try:
            pcm = decode(base64.b64decode(data, validate=True), self.input_format)
        except (binascii.Error, ValueError) as e:
            raise ProtocolError("invalid_value", f"Invalid 'audio': not valid base64 audio ({e}).", "audio") from None
        if self.buffer_ms / 1000 > self.limits.max_buffer_s:
            raise ProtocolError("input_audio_buffer_full", "Input audio buffer is full; commit or clear it.")
        self.buffer.append(pcm)
        ms = len(pcm) * 1000 / self.input_format.rate
        self.buffer_ms += ms
        self.clock_ms += ms
        if self.vad is not None:
            for ev in self.vad.push(to_model_rate(pcm, self.input_format)):
                await self._vad_event(ev)

    async def _vad_event(self, ev: SpeechStarted | SpeechStopped | IdleTimeout) -> None:
        td = self.config["audio"]["input"]["turn_detection"]
        if isinstance(ev, IdleTimeout):
            item_id = new_id("item")
            self.send({"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": ev.audio_start_ms,
                       "audio_end_ms": ev.audio_end_ms, "item_id": item_id})
            if self._commit(item_id) and td.get("create_response", True):
                self._respond_when_idle()
            return
        if isinstance(ev, SpeechStarted):
            self.speech_item = new_id("item")
            self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": int(ev.audio_start_ms),
                       "item_id": self.speech_item})
            if self.response is not None and td.get("interrupt_response", True):
                self._cancel("turn_detected")
            return
        item_id = self.speech_item or new_id("item")
        self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": int(ev.audio_end_ms),
                   "item_id": item_id})
        self.speech_item = None
        if self._commit(item_id) and td.get("create_response", True):
            self._respond_when_idle()

    def _respond_when_idle(self) -> None:
        """Answer now, or as soon as the response being cancelled (barge-in) has ended."""
        if self.response is None:
            self._start_response({})
        else:
            self.respond_after = True

    async def commit(self, event: dict) -> None:
        if self.buffer_ms < MIN_COMMIT_MS:
            raise ProtocolError("input_audio_buffer_commit_empty",
                                f"Error committing input audio buffer: buffer too small. Expected at least "
                                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {self.buffer_ms:.2f}ms of audio.")
        self._commit(new_id("item"))

    def _commit(self, item_id: str) -> bool:
        if self.buffer_ms < MIN_COMMIT_MS:
            self._clear_buffer()
            return False
        audio = to_model_rate(torch.cat(self.buffer), self.input_format)
        self._clear_buffer()
        self.committed_at = time.perf_counter()
        item = user_audio_item(item_id, audio)
        prev = self.conversation.insert(item)
        self.send({"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": item_id})
        self.send({"type": "conversation.item.added", "previous_item_id": prev, "item": item.data})
        self.send({"type": "conversation.item.done", "previous_item_id": prev, "item": item.data})
        if self.config["audio"]["input"].get("transcription"):
            self._transcribe(item)
        return True

    async def clear(self, event: dict) -> None:
        self._clear_buffer(restart_vad=True)
        self.send({"type": "input_audio_buffer.cleared"})

    def _clear_buffer(self, restart_vad: bool = False) -> None:
        self.buffer, self.buffer_ms = [], 0.0
        if restart_vad and self.vad is not None:
            self.vad.reset(int(self.clock_ms))

    async def item_create(self, event: dict) -> None:
        item = item_from_client(require(event, "item", dict), self.input_format)
        prev = self.conversation.insert(item, event.get("previous_item_id"))
        self.send({"type": "conversation.item.added", "previous_item_id": prev, "item": item.data})
        self.send({"type": "conversation.item.done", "previous_item_id": prev, "item": item.data})

    async def item_retrieve(self, event: dict) -> None:
        item = self.conversation.get(require(event, "item_id"))
        self.send({"type": "conversation.item.retrieved", "item": item.data})

    async def item_delete(self, event: dict) -> None:
        item_id = require(event, "item_id")
        self.conversation.delete(item_id)
        self.send({"type": "conversation.item.deleted", "item_id": item_id})

    async def item_truncate(self, event: dict) -> None:
        item = self.conversation.get(require(event, "item_id"))
        index = require(event, "content_index", int)
        end_ms = require(event, "audio_end_ms", int)
        if item.data.get("role") != "assistant" or not item.data["content"] or \
                item.data["content"][0].get("type") != "output_audio":
            raise ProtocolError("invalid_value", "Only assistant messages with audio can be truncated.", "item_id")
        if index != 0:
            raise ProtocolError("invalid_value", f"Invalid content_index: {index}.", "content_index")
        if end_ms < 0 or end_ms > item.audio_ms:
            raise ProtocolError("invalid_value", f"audio_end_ms ({end_ms}) is past the end of the item's audio "
                                f"({item.audio_ms} ms).", "audio_end_ms")
        if self.response is not None and any(i is item for i in self.response.items):
            self._cancel("client_cancelled")
            await asyncio.shield(self.task)
        rolled_back = False
        if item.turn_id is not None:
            try:
                text, rolled_back = await asyncio.wrap_future(self.pipeline.request(
                    lambda: self.pipeline.program.truncate_reply(self.pipe_session, item.turn_id, end_ms)))
                item.data["content"][0]["transcript"] = text
            except KeyError:
                pass
        if not rolled_back:  # the pipeline's cache still holds the whole reply: re-read at the next response
            self.sent_context = None
        item.audio_ms = end_ms
        self.send({"type": "conversation.item.truncated", "item_id": item.id, "content_index": 0,
                   "audio_end_ms": end_ms})

    async def response_create(self, event: dict) -> None:
        if self.response is not None:
            raise ProtocolError("conversation_already_has_active_response",
                                f"Conversation already has an active response in progress: {self.response.id}. "
                                "Wait until the response is finished before creating a new one.")
        spec = event.get("response") or {}
        if not isinstance(spec, dict):
            raise ProtocolError("invalid_type", "'response' must be an object", "response")
        self._start_response(spec)

    async def response_cancel(self, event: dict) -> None:
        if self.response is None:
            raise ProtocolError("response_cancel_not_active", "Cancellation failed: no active response found.")
        self._cancel("client_cancelled")

    # -- responses ---------------------------------------------------------------------------------
    def _start_response(self, spec: dict) -> None:
        allowed = {"conversation", "metadata", "input", "instructions", "output_modalities", "tools",
                   "tool_choice", "max_output_tokens", "audio", "prompt", "tracing"}
        unknown = set(spec) - allowed
        if unknown:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: 'response.{sorted(unknown)[0]}'.",
                                f"response.{sorted(unknown)[0]}")
        overrides = {k: spec[k] for k in ("instructions", "output_modalities", "tools", "tool_choice",
                                          "max_output_tokens", "audio") if k in spec}
        cfg = merge_update(self.config, overrides, path="response")
        out_of_band = spec.get("conversation", "auto") == "none"
        if spec.get("conversation", "auto") not in ("auto", "none"):
            raise ProtocolError("invalid_value", "conversation must be 'auto' or 'none'", "response.conversation")
        session, messages = self._messages(cfg, spec.get("input"), out_of_band)
        limit = cfg["max_output_tokens"]
        modality = cfg["output_modalities"][0]
        opts = GenerationOptions(
            audio=modality == "audio", speaker=speaker_for(cfg["audio"]["output"]["voice"]),
            max_text_tokens=self.limits.max_text_tokens if limit == "inf" else limit,
            max_frames=self.limits.max_frames, tools=tuple(cfg["tools"]) if cfg["tool_choice"] != "none" else (),
            tool_choice=cfg["tool_choice"],
        )
        turn = Turn(session, messages, opts)
        response = Response(self.send, None if out_of_band else self.conversation, modality,
                            AudioFormat.from_config(cfg["audio"]["output"]["format"]),
                            cfg["audio"]["output"]["voice"], limit, spec.get("metadata"), turn_id=turn.turn_id,
                            started=self.committed_at or time.perf_counter())
        response.on_audio_start = self.metrics.first_audio
        self.committed_at = None
        self.response = response
        response.created()
        self.task = asyncio.create_task(self._run(response, turn, out_of_band))

    def _messages(self, cfg: dict, inputs: list | None, out_of_band: bool) -> tuple[str, list[Message]]:
        """The pipeline session and the messages it has not seen yet (all of them after a reset)."""
        context = (cfg["instructions"], json.dumps(cfg["tools"]), json.dumps(cfg["tool_choice"]))
        system = [Message("system", cfg["instructions"])] if cfg["instructions"] else []
        if out_of_band or inputs is not None:
            items = [item_from_client(i, self.input_format) for i in inputs] if inputs is not None \
                else self.conversation.items
            return new_id("oob"), system + to_messages(items)
        ids = [i.id for i in self.conversation.items]
        if context == self.sent_context and ids[: len(self.sent)] == self.sent:
            new = self.conversation.items[len(self.sent):]
            messages = to_messages(new)
        else:
            self.pipeline.end_session(self.pipe_session)
            self.pipe_session = new_id("pipe")
            messages = system + to_messages(self.conversation.items)
        self.sent, self.sent_context = ids, context
        if not messages:
            raise ProtocolError("invalid_value", "Nothing new in the conversation to respond to.")
        return self.pipe_session, messages

    async def _run(self, response: Response, turn: Turn, out_of_band: bool) -> None:
        start = time.perf_counter()
        try:
            await response.run(self.pipeline.submit(turn))
        except Exception as e:  # never leave a client without response.done
            log.exception("response %s failed", response.id)
            response.fail(str(e))
        finally:
            if out_of_band:
                self.pipeline.end_session(turn.session_id)
            else:
                self.sent.extend(i.id for i in response.items)
            if response.audio_samples:
                self.metrics.rtf((time.perf_counter() - start) / (response.audio_samples / 24000))
            logs.response_done(self.config["id"], response)
            if self.response is response:
                self.response = None
            if self.respond_after and self.response is None:
                self.respond_after = False
                try:
                    self._start_response({})
                except ProtocolError as e:
                    self.send(e.event(None))
            if self.vad is not None:
                self.vad.arm_idle(self.vad.position_ms)

    def _cancel(self, reason: str) -> None:
        if self.response is not None and self.response.status == "in_progress":
            self.response.cancel_reason = reason
            self.pipeline.abort(self.response.turn_id)

    # -- input transcription, by the model itself, in the background -------------------------------------
    def _transcribe(self, item: Item) -> None:
        opts = GenerationOptions(audio=False, background=True, max_text_tokens=self.limits.transcription_tokens)
        turn = Turn(new_id("asr"), [Message("system", "Transcribe the user's speech exactly, in its language. "
                                                      "Reply with the transcript only."),
                                    Message("user", "", item.audio)], opts)

        async def run() -> None:
            text = ""
            try:
                async for ev in self.pipeline.submit(turn):
                    if isinstance(ev, TextDelta) and ev.text:
                        text += ev.text
                        self.send({"type": "conversation.item.input_audio_transcription.delta",
                                   "item_id": item.id, "content_index": 0, "delta": ev.text})
                    elif isinstance(ev, TurnDone):
                        item.data["content"][0]["transcript"] = text
                        u = ev.usage
                        self.send({"type": "conversation.item.input_audio_transcription.completed",
                                   "item_id": item.id, "content_index": 0, "transcript": text,
                                   "usage": {"type": "tokens", "input_tokens": u.input_tokens,
                                             "output_tokens": u.output_tokens,
                                             "total_tokens": u.input_tokens + u.output_tokens}})
            finally:
                self.pipeline.end_session(turn.session_id)

        task = asyncio.create_task(run())
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # -- helpers -----------------------------------------------------------------------------------
    @property
    def input_format(self) -> AudioFormat:
        return AudioFormat.from_config(self.config["audio"]["input"]["format"])

    def _reset_vad(self) -> None:
        td = self.config["audio"]["input"]["turn_detection"]
        if not td:
            self.vad = None
        elif self.vad is None or self.vad.cfg != VadConfig.from_config(td):
            self.vad = ServerVad(VadConfig.from_config(td))
            self.vad.reset(int(self.clock_ms))


HANDLERS = {
    "session.update": RealtimeSession.session_update,
    "input_audio_buffer.append": RealtimeSession.append,
    "input_audio_buffer.commit": RealtimeSession.commit,
    "input_audio_buffer.clear": RealtimeSession.clear,
    "conversation.item.create": RealtimeSession.item_create,
    "conversation.item.retrieve": RealtimeSession.item_retrieve,
    "conversation.item.delete": RealtimeSession.item_delete,
    "conversation.item.truncate": RealtimeSession.item_truncate,
    "response.create": RealtimeSession.response_create,
    "response.cancel": RealtimeSession.response_cancel,
}
