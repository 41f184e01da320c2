"""One Realtime session per WebSocket: its config, conversation, input audio buffer, turn detection and
active response, driven by client events and by the pipeline."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import torch

from pipelines.pipeline import Pipeline
from pipelines.types import Event, GenerationOptions, Message, Turn, TurnError

from . import logs
from .audio import AudioFormat, to_model_rate
from .capabilities import check_config, model_voice
from .input_audio import AppendRate, decode_append, encoded
from .items import Conversation, Item, item_from_client, to_messages, user_audio_item
from .metrics import Metrics
from .protocol import (
    ProtocolError,
    check_metadata,
    client_event_id,
    clip,
    default_session,
    merge_update,
    new_id,
    parse_event,
    require,
    update_session,
)
from .response import Response
from .transcription import transcribe
from .vad import IdleTimeout, ServerVad, SpeechStarted, SpeechStopped, VadConfig

log = logging.getLogger(__name__)
MAX_APPEND_BYTES = 15 * 1024 * 1024
MAX_ITEM_CHARS = 4 * 1024 * 1024  # an item as the server echoes it (JSON, non-ASCII escaped): twice in the outbox
MIN_COMMIT_MS = 100
PARSE_OFF_LOOP_CHARS = 1 << 20  # larger frames are parsed on the audio worker
SERVER_ERROR = ProtocolError("server_error", "The server had an error while processing your request.",
                             type="server_error")


@dataclass(frozen=True)
class Limits:
    max_buffer_s: float = 600.0  # input audio kept before a commit
    max_text_tokens: int = 1024  # for max_output_tokens "inf"
    max_frames: int = 1500  # 2 minutes of speech per response
    transcription_tokens: int = 256
    max_buffer_bytes: int = 64 * 1024 * 1024  # input audio held before a commit, as float32 samples
    max_appends_per_s: float = 500.0  # sustained append rate; bursts up to append_burst
    append_burst: int = 1000
    max_items: int = 4096  # conversation items kept per session


def _items_from_client(raws: list, fmt: AudioFormat, rate: int) -> list[Item]:
    return [item_from_client(raw, fmt, rate) for raw in raws]


def _item_to_add(raw: dict, fmt: AudioFormat, rate: int) -> Item:
    """A conversation.item.create's item, refused when its echoes (item.added and item.done) would be huge."""
    item = item_from_client(raw, fmt, rate)
    if len(json.dumps(item.data)) > MAX_ITEM_CHARS:
        raise ProtocolError("item_too_large", f"Item is larger than {MAX_ITEM_CHARS >> 20} MiB as JSON: send its "
                            "text in smaller items (the model's context holds far less anyway).", "item")
    return item


class RealtimeSession:
    def __init__(self, send: Callable[[dict], None], pipeline: Pipeline, model: str, metrics: Metrics,
                 limits: Limits = Limits(), executor: Executor | None = None, intent: str | None = None) -> None:
        """`executor` runs the audio work (decoding, resampling, turn detection) off the event loop; a
        session hands it one job at a time, so its audio stays in order. `intent` "transcription" (the
        connect URL's `?intent=`) starts a transcription session."""
        self._send_raw, self.pipeline, self.metrics, self.limits = send, pipeline, metrics, limits
        self.executor = executor
        self.append_rate = AppendRate(limits.max_appends_per_s, limits.append_burst)
        self._arm_idle: int | None = None
        self.model = model
        self.config = default_session(model, pipeline.spec)
        if intent == "transcription":
            self.config = update_session(self.config, {"type": "transcription"}, model, pipeline.spec)
        self.conversation = Conversation()
        self.buffer: list[torch.Tensor] = []  # input audio at the input format's rate
        self.buffer_ms = 0.0
        self.buffer_bytes = 0
        self.clock_ms = 0.0  # all input audio of the session (the VAD's and the protocol's time line)
        self.vad: ServerVad | None = None
        self.speech_item: str | None = None
        self.response: Response | None = None
        self.task: asyncio.Task | None = None
        self.pipe_session = new_id("pipe")
        self.sent: list[str] = []  # item ids the pipeline session already holds, in order
        self.sent_context: tuple | None = None
        self.dropped: set[str] = set()  # items truncation took out of the model's context (the client keeps them)
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
        """One client frame. Whatever goes wrong becomes an error event; the session goes on."""
        event_id = None
        try:
            big = isinstance(raw, str) and len(raw) > PARSE_OFF_LOOP_CHARS
            event = await self._off(parse_event, raw) if big else parse_event(raw)
            event_id = client_event_id(event)
            handler = HANDLERS.get(require(event, "type"))
            if handler is None:
                raise ProtocolError("invalid_value", f"Invalid value: '{clip(event['type'])}'. Not a client event "
                                    "type.", "type")
            await handler(self, event)
        except ProtocolError as e:
            self.metrics.error(e.code)
            self.send(e.event(event_id))
        except Exception:
            log.exception("session %s: a client event failed", self.config.get("id"))
            self.metrics.error(SERVER_ERROR.code)
            self.send(SERVER_ERROR.event(event_id))

    async def _off(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def session_update(self, event: dict) -> None:
        config = update_session(self.config, require(event, "session", dict), self.model, self.pipeline.spec)
        self.config = check_config(config, self.pipeline.spec)
        self._reset_vad()
        self.send({"type": "session.updated", "session": self.config})

    async def append(self, event: dict) -> None:
        data = require(event, "audio")
        if len(data) > MAX_APPEND_BYTES * 4 // 3 + 4:
            raise ProtocolError("invalid_value", "Audio chunk is larger than 15 MiB.", "audio")
        if not self.append_rate.take():
            raise ProtocolError("rate_limit_exceeded", f"Too many input_audio_buffer.append events: at most "
                                f"{self.limits.max_appends_per_s:g} per second; send larger chunks.")
        fmt = self.input_format
        held = len(data) * 3 // 4 // fmt.bytes_per_sample * 4
        if self.buffer_ms / 1000 > self.limits.max_buffer_s or \
                self.buffer_bytes + held > self.limits.max_buffer_bytes:
            raise ProtocolError("input_audio_buffer_full", "Input audio buffer is full; commit or clear it.")
        arm, self._arm_idle = self._arm_idle, None
        try:
            pcm, events = await self._off(decode_append, data, fmt, self.vad, arm)
        except ProtocolError:
            self._arm_idle = arm if self._arm_idle is None else self._arm_idle  # armed by the next good append
            raise
        self.buffer.append(pcm)
        ms = len(pcm) * 1000 / fmt.rate
        self.buffer_ms += ms
        self.buffer_bytes += pcm.numel() * 4
        self.clock_ms += ms
        for ev in events:
            await self._vad_event(ev)

    async def _vad_event(self, ev: SpeechStarted | SpeechStopped | IdleTimeout) -> None:
        td = self.config["audio"]["input"]["turn_detection"]
        if isinstance(ev, IdleTimeout):
            if self.response is not None:  # the timer starts again when this response has played
                return
            item_id = new_id("item")
            self.send({"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": ev.audio_start_ms,
                       "audio_end_ms": ev.audio_end_ms, "item_id": item_id})
            if await self._commit(item_id) and td.get("create_response", True):
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
        if await self._commit(item_id) and td.get("create_response", True):
            self._respond_when_idle()

    def _respond_when_idle(self) -> None:
        """Answer now, or as soon as the response being cancelled (barge-in) has ended."""
        if self.transcribing:
            return
        if self.response is None:
            self._start_response({})
        else:
            self.respond_after = True

    async def commit(self, event: dict) -> None:
        if self.buffer_ms < MIN_COMMIT_MS:
            raise ProtocolError("input_audio_buffer_commit_empty",
                                f"Error committing input audio buffer: buffer too small. Expected at least "
                                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {self.buffer_ms:.2f}ms of audio.")
        await self._commit(new_id("item"))

    async def _commit(self, item_id: str) -> bool:
        if self.buffer_ms < MIN_COMMIT_MS:
            self._clear_buffer()
            return False
        buffer, fmt = self.buffer, self.input_format
        self._clear_buffer()
        audio = await self._off(lambda: to_model_rate(torch.cat(buffer), fmt, self.pipeline.spec.input_rate))
        self.committed_at = time.perf_counter()
        item = user_audio_item(item_id, audio)
        prev = self.conversation.insert(item)
        self.send({"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": item_id})
        self.send({"type": "conversation.item.added", "previous_item_id": prev, "item": item.data})
        self.send({"type": "conversation.item.done", "previous_item_id": prev, "item": item.data})
        if self.transcribing or self.config["audio"]["input"].get("transcription"):
            self._transcribe(item)
        return True

    async def clear(self, event: dict) -> None:
        self._clear_buffer(restart_vad=True)
        self.send({"type": "input_audio_buffer.cleared"})

    def _clear_buffer(self, restart_vad: bool = False) -> None:
        self.buffer, self.buffer_ms, self.buffer_bytes = [], 0.0, 0
        if restart_vad and self.vad is not None:
            self.vad.reset(int(self.clock_ms))

    async def item_create(self, event: dict) -> None:
        raw = require(event, "item", dict)
        if len(self.conversation.items) >= self.limits.max_items:
            raise ProtocolError("conversation_full", f"The conversation holds {self.limits.max_items} items; "
                                "delete some first.")
        item = await self._off(_item_to_add, raw, self.input_format, self.pipeline.spec.input_rate)
        if any(i.id == item.id for i in self.conversation.items):
            raise ProtocolError("invalid_value", f"Item {clip(item.id)} already exists.", "item.id")
        prev = self.conversation.insert(item, event.get("previous_item_id"))
        self.send({"type": "conversation.item.added", "previous_item_id": prev, "item": item.data})
        self.send({"type": "conversation.item.done", "previous_item_id": prev, "item": item.data})

    async def item_retrieve(self, event: dict) -> None:
        item = self.conversation.get(require(event, "item_id"))
        data = item.data
        if item.audio is not None and data.get("role") == "user":  # the user's audio, in the session's format
            audio = await self._off(encoded, item.audio, self.input_format, self.pipeline.spec.input_rate)
            data = {**data, "content": [{**p, "audio": audio} if p["type"] == "input_audio" else p
                                        for p in data["content"]]}
        self.send({"type": "conversation.item.retrieved", "item": data})

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
                heard_ms = int(end_ms * item.speed)  # of the model's audio, before the time-scaling
                text, rolled_back = await asyncio.wrap_future(
                    self.pipeline.truncate_reply(self.pipe_session, item.turn_id, heard_ms))
                item.data["content"][0]["transcript"] = text
            except KeyError:
                pass
        if not rolled_back:  # the pipeline's cache still holds the whole reply: re-read at the next response
            self.sent_context = None
        item.audio_ms = end_ms
        self.send({"type": "conversation.item.truncated", "item_id": item.id, "content_index": 0,
                   "audio_end_ms": end_ms})

    async def response_create(self, event: dict) -> None:
        if self.transcribing:
            raise ProtocolError("invalid_value", "A transcription session does not create responses.", "session.type")
        if self.response is not None:
            raise ProtocolError("conversation_already_has_active_response",
                                f"Conversation already has an active response in progress: {self.response.id}. "
                                "Wait until the response is finished before creating a new one.")
        spec = {} if event.get("response") is None else event["response"]
        if not isinstance(spec, dict):
            raise ProtocolError("invalid_type", "'response' must be an object", "response")
        self._response_config(spec)  # every check before any work
        inputs = spec.get("input")
        if inputs is not None:
            if not isinstance(inputs, list) or len(inputs) > self.limits.max_items:
                raise ProtocolError("invalid_type", "'response.input' must be a list of items", "response.input")
            inputs = await self._off(_items_from_client, inputs, self.input_format, self.pipeline.spec.input_rate)
            if self.response is not None:  # a turn-detected response started meanwhile
                raise ProtocolError("conversation_already_has_active_response",
                                    f"Conversation already has an active response in progress: {self.response.id}.")
        self._start_response(spec, inputs)

    async def response_cancel(self, event: dict) -> None:
        wanted = event.get("response_id")
        if wanted is not None and not isinstance(wanted, str):
            raise ProtocolError("invalid_type", "'response_id' must be a string", "response_id")
        if self.response is None or wanted not in (None, self.response.id):
            raise ProtocolError("response_cancel_not_active", "Cancellation failed: no active response found"
                                + (f" with id {clip(wanted)}." if wanted else "."), "response_id" if wanted else None)
        self._cancel("client_cancelled")

    # -- responses ---------------------------------------------------------------------------------
    def _response_config(self, spec: dict) -> dict:
        """The session config with a response.create's overrides, every field checked."""
        allowed = {"conversation", "metadata", "input", "instructions", "output_modalities", "tools",
                   "tool_choice", "max_output_tokens", "audio", "prompt", "tracing", "reasoning", "parallel_tool_calls"}
        unknown = sorted(clip(k) for k in set(spec) - allowed)
        if unknown:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: 'response.{unknown[0]}'.",
                                f"response.{unknown[0]}")
        overrides = {k: spec[k] for k in ("instructions", "output_modalities", "tools", "tool_choice",
                                          "max_output_tokens", "audio", "prompt", "tracing", "reasoning",
                                          "parallel_tool_calls") if k in spec}
        cfg = check_config(merge_update(self.config, overrides, path="response"), self.pipeline.spec, "response")
        if spec.get("conversation", "auto") not in ("auto", "none"):
            raise ProtocolError("invalid_value", "conversation must be 'auto' or 'none'", "response.conversation")
        check_metadata(spec.get("metadata"), "response.metadata")
        return cfg

    def _start_response(self, spec: dict, inputs: list[Item] | None = None) -> None:
        cfg = self._response_config(spec)
        out_of_band = spec.get("conversation", "auto") == "none"
        own_session = out_of_band or inputs is not None  # a pipeline session of its own, ended with the response
        session, messages = self._messages(cfg, inputs, out_of_band)
        limit = cfg["max_output_tokens"]
        modality = cfg["output_modalities"][0]
        opts = GenerationOptions(
            audio=modality == "audio", voice=model_voice(cfg["audio"]["output"]["voice"], self.pipeline.spec),
            max_text_tokens=self.limits.max_text_tokens if limit == "inf" else limit,
            max_frames=self.limits.max_frames if limit == "inf" else min(limit, self.limits.max_frames),
            tools=tuple(cfg["tools"]) if cfg["tool_choice"] != "none" else (),
            tool_choice=cfg["tool_choice"],
        )
        turn = Turn(session, messages, opts)
        response = Response(self.send, None if out_of_band else self.conversation, modality,
                            AudioFormat.from_config(cfg["audio"]["output"]["format"]),
                            cfg["audio"]["output"]["voice"], limit, spec.get("metadata"), turn_id=turn.turn_id,
                            started=self.committed_at or time.perf_counter(), rate=self.pipeline.spec.output_rate)
        response.on_audio_start = self.metrics.first_audio
        response.speed = float(cfg["audio"]["output"]["speed"])
        response.on_cap = lambda: self.pipeline.abort(response.turn_id)
        self.committed_at = None
        self.response = response
        response.created()
        events = self.pipeline.submit(turn) if own_session else self._events(turn, response, cfg)
        self.task = asyncio.create_task(self._run(response, turn, events, own_session))

    def _messages(self, cfg: dict, inputs: list[Item] | None, out_of_band: bool) -> tuple[str, list[Message]]:
        """The pipeline session and the messages it has not seen yet (all of them after a reset)."""
        context = (cfg["instructions"], json.dumps(cfg["tools"]), json.dumps(cfg["tool_choice"]))
        system = [Message("system", cfg["instructions"])] if cfg["instructions"] else []
        if out_of_band or inputs is not None:
            messages = system + to_messages(inputs if inputs is not None else self._context())
            if not messages:
                raise ProtocolError("invalid_value", "Nothing to respond to.", "response.input")
            return new_id("oob"), messages
        items = self._context()
        ids = [i.id for i in items]
        reuse = context == self.sent_context and ids[: len(self.sent)] == self.sent
        messages = to_messages(items[len(self.sent):]) if reuse else system + to_messages(items)
        if not messages:
            raise ProtocolError("invalid_value", "Nothing new in the conversation to respond to.")
        if not reuse:
            self.pipeline.end_session(self.pipe_session)
            self.pipe_session = new_id("pipe")
        self.sent, self.sent_context = ids, context
        return self.pipe_session, messages

    def _context(self) -> list[Item]:
        """The conversation as the model reads it: without the items truncation dropped."""
        return [i for i in self.conversation.items if i.id not in self.dropped]

    async def _events(self, turn: Turn, response: Response, cfg: dict) -> AsyncIterator[Event]:
        """The turn's events. A turn refused as too long for the context is retried, unless truncation is
        disabled, as a fresh prefill of the newest items (the retention ratio of them; `auto`: 3/4), until
        it fits or one item is left."""
        truncation = cfg["truncation"]
        ratio = None if truncation == "disabled" else 0.75 if truncation == "auto" else truncation["retention_ratio"]
        while True:
            events = self.pipeline.submit(turn)
            first = await anext(events)
            items = self._context()
            keep = max(1, int(len(items) * (ratio or 0)))
            if ratio is None or not isinstance(first, TurnError) or first.code != "context_too_long" \
                    or keep >= len(items):
                break
            await events.aclose()
            self.dropped.update(i.id for i in items[: len(items) - keep])
            self.sent_context = None  # a new pipeline session: the kept items are prefilled again
            turn = Turn(*self._messages(cfg, None, False), turn.options)
            response.turn_id = turn.turn_id
        yield first
        async for event in events:
            yield event

    async def _run(self, response: Response, turn: Turn, events: AsyncIterator[Event], own_session: bool) -> None:
        start = time.perf_counter()
        try:
            await response.run(events)
        except Exception as e:  # never leave a client without response.done
            log.exception("response %s failed", response.id)
            response.fail(str(e))
        finally:
            if own_session:
                self.pipeline.end_session(turn.session_id)
            else:
                self.sent.extend(i.id for i in response.items)
            if response.audio_samples:
                self.metrics.rtf((time.perf_counter() - start) / (response.audio_samples / response.rate))
            logs.response_done(self.config["id"], response)
            ended = "cancelled" if response.status == "in_progress" else response.status  # cut off with the socket
            self.metrics.response_done(ended, response.error)
            if self.response is response:
                self.response = None
            if self.respond_after and self.response is None:
                self.respond_after = False
                try:
                    self._start_response({})
                except ProtocolError as e:
                    self.send(e.event(None))
                except Exception:
                    log.exception("response after a barge-in failed to start")
                    self.send(SERVER_ERROR.event(None))
            # GA: the idle timer starts once the reply's audio has played (its end + its duration), on the
            # audio clock from its next push
            self._arm_idle = response.audio_ms

    def _cancel(self, reason: str) -> None:
        if self.response is not None and self.response.status == "in_progress":
            self.response.cancel_reason = reason
            self.pipeline.abort(self.response.turn_id)

    # -- input transcription, by the model itself, in the background -------------------------------------
    def _transcribe(self, item: Item) -> None:
        task = asyncio.create_task(transcribe(self.pipeline, self.send, item, self.limits.transcription_tokens))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # -- helpers -----------------------------------------------------------------------------------
    @property
    def transcribing(self) -> bool:
        """A transcription session: transcripts of each commit, never a response."""
        return self.config["type"] == "transcription"

    @property
    def input_format(self) -> AudioFormat:
        return AudioFormat.from_config(self.config["audio"]["input"]["format"])

    def _reset_vad(self) -> None:
        td = self.config["audio"]["input"]["turn_detection"]
        if not td:
            self.vad = None
        elif self.vad is None or self.vad.cfg != VadConfig.from_config(td):
            self.vad = ServerVad(VadConfig.from_config(td), self.pipeline.spec.input_rate)
            self.vad.reset(int(self.clock_ms))
            if self.response is None:  # the timer runs from now: the session's start, or this update
                self.vad.arm_idle(int(self.clock_ms))


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
