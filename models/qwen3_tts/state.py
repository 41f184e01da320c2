"""Qwen3-TTS's per-session state (only its active turn: a reading keeps nothing) and per-turn state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pipelines.types import AudioChunk, Event, TextDelta, TurnDone, TurnError, Usage

from .prompt import TalkerPrompt
from .spec import TurnSettings


@dataclass
class Session:
    id: str
    turn: TurnState | None = None

    @property
    def kv_key(self) -> str:
        return f"tts:{self.id}"


@dataclass
class TurnState:
    turn_id: str
    session: Session
    options: TurnSettings
    emit_event: Callable[[Event], None]
    prompt: TalkerPrompt
    text: str  # what is read
    text_ids: tuple[int, ...]
    input_tokens: int
    rate: int
    on_close: Callable[[], None] = lambda: None
    codes: list[list[int]] = field(default_factory=list)
    frames_out: list[torch.Tensor] = field(default_factory=list)  # [16] codes waiting for the codec
    talker_done: bool = False
    audio_stop: str = "completed"
    audio_done: bool = False
    audio_samples: int = 0
    finished: bool = False
    t_start: float = field(default_factory=time.perf_counter)
    t_first_audio: float | None = None

    def emit(self, event: Event) -> None:
        if not self.finished:
            self.emit_event(event)

    def urgency(self) -> float:
        """Seconds of audio the listener still has buffered; before the first audio, minus the wait."""
        if self.options.background:
            return float("inf")
        now = time.perf_counter()
        if self.t_first_audio is None:
            return self.t_start - now
        return self.audio_samples / self.rate - (now - self.t_first_audio)

    def on_frame(self, codes: list[int], row: torch.Tensor, embed_sum: torch.Tensor, eos: int) -> torch.Tensor | None:
        if codes[0] == eos:
            self.talker_done = True
            return None
        if not self.codes:  # the transcript of the speech is the text read
            self.emit(TextDelta(self.turn_id, self.text, self.text_ids))
        self.codes.append(codes)
        self.frames_out.append(row)
        if len(self.codes) >= self.options.max_frames:
            self.talker_done, self.audio_stop = True, "length"
            return None
        return embed_sum

    def on_audio(self, chunk: AudioChunk) -> None:
        if self.t_first_audio is None:
            self.t_first_audio = time.perf_counter()
        self.audio_samples += chunk.pcm.shape[0]
        self.emit(chunk)

    def fail(self, code: str, message: str) -> None:
        if not self.finished:
            self.emit_event(TurnError(self.turn_id, code, message))
            self._close()

    def _close(self) -> None:
        self.finished = True
        if self.session.turn is self:
            self.session.turn = None
        self.on_close()

    def maybe_finish(self) -> bool:
        if self.finished or not self.audio_done:
            return False
        self.finish(self.audio_stop)
        return True

    def finish(self, status: str) -> None:
        if self.finished:
            return
        now = time.perf_counter()
        timings = {"total_ms": (now - self.t_start) * 1e3}
        if self.t_first_audio is not None:
            timings["first_audio_ms"] = (self.t_first_audio - self.t_start) * 1e3
        if self.audio_samples:
            timings["rtf"] = (now - self.t_start) / (self.audio_samples / self.rate)
        spoken = bool(self.codes)
        usage = Usage(self.input_tokens, 0, 0, len(self.codes))
        self.emit(TurnDone(self.turn_id, status, self.text if spoken else "", self.text_ids if spoken else (),
                           tuple(map(tuple, self.codes)), usage, timings))
        self._close()
