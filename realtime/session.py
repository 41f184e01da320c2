"""One Realtime session per WebSocket: its config, conversation, input audio buffer, turn detection and responses."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import torch

from pipelines.pipeline import Pipeline
from pipelines.types import AudioAhead

from .audio import AudioFormat, InputStream, to_model_rate
from .capabilities import check_config
from .early_reply import EarlyReply
from .input_audio import AppendRate, AudioWorkers, decode_append, default_workers
from .item_events import ItemEvents
from .items import Conversation, user_audio_item
from .metrics import Metrics
from .protocol import (
    SERVER_ERROR,
    ProtocolError,
    client_event_id,
    clip,
    default_session,
    new_id,
    parse_event,
    require,
    update_session,
)
from .responding import Responding
from .response import Response
from .transcription import transcribe
from .vad import EndLikely, EndWithdrawn, IdleTimeout, ServerVad, SpeechStarted, VadConfig, VadEvent
from .voices import CustomVoices

log = logging.getLogger(__name__)
MAX_APPEND_BYTES = 15 * 1024 * 1024
MIN_COMMIT_MS = 100
PARSE_OFF_LOOP_CHARS = 1 << 20  # larger frames are parsed on the audio worker


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
    encode_ahead: bool = True  # encode input audio as it arrives (where the model can: Pipeline.audio_ahead)
    ignore_eos: bool = False  # benchmarks: every reply runs to its token and frame limits


class RealtimeSession(EarlyReply, ItemEvents, Responding):
    min_commit_ms = MIN_COMMIT_MS

    def __init__(self, send: Callable[[dict], None], pipeline: Pipeline, model: str, metrics: Metrics,
                 limits: Limits = Limits(), executor: Executor | None = None, intent: str | None = None,
                 voices: CustomVoices | None = None) -> None:
        """`executor`: threads taking jobs in order, as ThreadPoolExecutor's (default: `default_workers()`), for the
        audio work, one job at a time per session (its audio stays in order); `intent`: the connect URL's `?intent=`."""
        self._send_raw, self.pipeline, self.metrics, self.limits = send, pipeline, metrics, limits
        self.voices = voices
        self.executor = executor if executor is not None else default_workers()
        self.append_rate = AppendRate(limits.max_appends_per_s, limits.append_burst)
        self._arm_idle: int | None = None
        self.model = model
        self.config = default_session(model, pipeline.spec)
        if intent == "transcription":
            self.config = update_session(self.config, {"type": "transcription"}, model, pipeline.spec)
        self.input_format = AudioFormat.from_config(self.config["audio"]["input"]["format"])
        self.conversation = Conversation()
        self.buffer: list[torch.Tensor] = []  # input audio at the input format's rate
        self.buffer_ms = 0.0
        self.buffer_bytes = 0
        self.input: InputStream | None = None  # the buffer at the model rate, as it arrives
        self._input_job: Future | None = None  # the last of its work queued on the audio worker
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
        self._discard_held()
        self._clear_buffer()
        self.pipeline.end_session(self.pipe_session)

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
            self.metrics.errors.labels(code=e.code).inc()
            self.send(e.event(event_id))
        except Exception:
            log.exception("session %s: a client event failed", self.config.get("id"))
            self.metrics.errors.labels(code=SERVER_ERROR.code).inc()
            self.send(SERVER_ERROR.event(event_id))

    async def _off(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def session_update(self, event: dict) -> None:
        config = update_session(self.config, require(event, "session", dict), self.model, self.pipeline.spec)
        self.config = check_config(config, self.pipeline.spec, voices=self.voices)
        self.input_format = AudioFormat.from_config(self.config["audio"]["input"]["format"])
        self._discard_held()
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
        if self.buffer_ms / 1000 > self.limits.max_buffer_s or self.buffer_bytes + held > self.limits.max_buffer_bytes:
            raise ProtocolError("input_audio_buffer_full", "Input audio buffer is full; commit or clear it.")
        arm, self._arm_idle = self._arm_idle, None
        try:
            if self.vad is None and len(data) <= PARSE_OFF_LOOP_CHARS:  # a worker's round trip costs more
                pcm, events = decode_append(data, fmt, None, arm)
            else:
                pcm, events = await self._off(decode_append, data, fmt, self.vad, arm)
        except ProtocolError:
            self._arm_idle = arm if self._arm_idle is None else self._arm_idle  # armed by the next good append
            raise
        self.buffer.append(pcm)
        self._stream_input(pcm, fmt)
        n = pcm.shape[0]
        ms = n * 1000 / fmt.rate
        self.buffer_ms += ms
        self.buffer_bytes += n * 4
        self.clock_ms += ms
        for ev in events:
            await self._vad_event(ev)

    async def _vad_event(self, ev: VadEvent) -> None:
        td = self.config["audio"]["input"]["turn_detection"]
        if isinstance(ev, EndLikely):  # the user has probably finished: start the reply, held back
            return await self._hold_reply()
        if isinstance(ev, EndWithdrawn):  # they go on speaking
            return self._discard_held()
        if isinstance(ev, SpeechStarted):
            self._discard_held()
            self.speech_item = new_id("item")
            self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": int(ev.audio_start_ms),
                       "item_id": self.speech_item})
            if self.response is not None and td.get("interrupt_response", True):
                self._cancel("turn_detected")
            return
        if isinstance(ev, IdleTimeout):
            if self.response is not None:  # the timer starts again when this response has played
                return
            item_id = new_id("item")
            self.send({"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": ev.audio_start_ms,
                       "audio_end_ms": ev.audio_end_ms, "item_id": item_id})
        else:
            item_id, self.speech_item = self.speech_item or new_id("item"), None
            self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": int(ev.audio_end_ms),
                       "item_id": item_id})
        if await self._commit(item_id) and td.get("create_response", True) and not self.transcribing:
            if self.response is None:
                self._start_response({})
            else:  # answered as soon as the response being cancelled (barge-in) has ended
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
        arrived = time.perf_counter()  # the user's turn ends: the clock of the time to first audio starts
        item = self._held_item(item_id)  # made from this very buffer at EndLikely
        audio = self._buffer_audio(last=True) if item is None else None
        self._clear_buffer()
        if item is None:
            item = user_audio_item(item_id, *await audio)
        self.committed_at = arrived
        self.metrics.commit_input.observe(time.perf_counter() - arrived)
        for old in self.conversation.items:  # only the newest item's audio waits encoded ahead
            old.ahead = None
        prev = self.conversation.insert(item)
        self.send({"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": item_id})
        self._echo(prev, item)
        if self.transcribing or self.config["audio"]["input"].get("transcription"):
            task = asyncio.create_task(transcribe(self.pipeline, self.send, item, self.limits.transcription_tokens))
            self.background.add(task)
            task.add_done_callback(self.background.discard)
        return True

    async def clear(self, event: dict) -> None:
        self._discard_held()
        self._clear_buffer(restart_vad=True)
        self.send({"type": "input_audio_buffer.cleared"})

    def _clear_buffer(self, restart_vad: bool = False) -> None:
        self.buffer, self.buffer_ms, self.buffer_bytes = [], 0.0, 0
        self.input = self._input_job = None  # queued work on it ends on its own
        if restart_vad and self.vad is not None:
            self.vad.reset(int(self.clock_ms))

    def _reset_vad(self) -> None:
        td = self.config["audio"]["input"]["turn_detection"]
        if not td:
            self.vad = None
        elif self.vad is None or self.vad.cfg != VadConfig.from_config(td):
            self.vad = ServerVad(VadConfig.from_config(td), self.pipeline.spec.input_rate, early=True)
            self.vad.reset(int(self.clock_ms))
            if self.response is None:  # the timer runs from now: the session's start, or this update
                self.vad.arm_idle(int(self.clock_ms))

    def _stream_input(self, pcm: torch.Tensor, fmt: AudioFormat) -> None:
        """Resample the new audio (and encode it ahead) on the audio worker, in order, not holding up the appends."""
        if len(self.buffer) == 1 and self.pipeline.spec.input_rate:  # a new buffer
            ahead = self.pipeline.audio_ahead() if self.limits.encode_ahead and not self.transcribing else None
            self.input = InputStream(fmt, self.pipeline.spec.input_rate, ahead)
        if self.input is not None and self.input.fmt != fmt:  # the format changed: resampled whole at the commit
            self.input = None
        idle = isinstance(self.executor, AudioWorkers) and self.executor.idle
        if self.input is not None and (batch := self.input.collect(pcm, idle)) is not None:
            self._input_job = self._after_input(self.input.encode, batch)

    def _after_input(self, fn: Callable[..., Any], *args: Any) -> Future:
        """`fn(*args)` on the audio worker once the input stream's queued work has run (a failure there fails this: a
        commit never gets audio with a piece missing). It waits for that job on the worker, not the event loop (~1 ms
        a commit): the workers take jobs in order, so the one before has been taken."""
        prev = self._input_job

        def run() -> Any:
            if prev is not None:
                prev.result()  # its failure was logged where it happened
            try:
                return fn(*args)
            except Exception:
                log.exception("session %s: input audio work failed", self.config.get("id"))
                raise

        return self.executor.submit(run)

    def _buffer_audio(self, last: bool) -> Awaitable[tuple[torch.Tensor, AudioAhead | None]]:
        """The input buffer as it is now at the model's input rate, and its encoding so far (InputStream.take)."""
        if self.input is not None:
            self._input_job = self._after_input(self.input.take, last, self.input.rest())
            return asyncio.wrap_future(self._input_job)
        buffer, fmt = list(self.buffer), self.input_format
        return self._off(lambda: (to_model_rate(torch.cat(buffer), fmt, self.pipeline.spec.input_rate), None))

    @property
    def transcribing(self) -> bool:
        """A transcription session: transcripts of each commit, never a response."""
        return self.config["type"] == "transcription"


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
