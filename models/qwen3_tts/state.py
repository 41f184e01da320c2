"""Qwen3-TTS's per-session state (only its active turn: a reading keeps nothing) and per-turn state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from models.common.speaking import SpeakingState
from pipelines.types import Event, TextDelta, TurnDone, Usage

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
class TurnState(SpeakingState):
    turn_id: str
    session: Session
    options: TurnSettings
    emit_event: Callable[[Event], None]
    prompt: TalkerPrompt
    text: str  # what is read
    text_ids: tuple[int, ...]
    input_tokens: int
    rate: int

    def urgency(self) -> float:
        return float("inf") if self.options.background else self.audio_urgency()

    def on_frame(self, codes: list[int], row: torch.Tensor, embed_sum: torch.Tensor, eos: int) -> torch.Tensor | None:
        if codes[0] != eos and not self.codes:  # the transcript of the speech is the text read
            self.emit(TextDelta(self.turn_id, self.text, self.text_ids))
        return super().on_frame(codes, row, embed_sum, eos)

    def maybe_finish(self) -> bool:
        if self.finished or not self.audio_done:
            return False
        self.finish(self.audio_stop)
        return True

    def finish(self, status: str) -> None:
        if self.finished:
            return
        timings = self.timings(time.perf_counter())
        spoken = bool(self.codes)
        usage = Usage(self.input_tokens, 0, 0, len(self.codes))
        self.emit(TurnDone(self.turn_id, status, self.text if spoken else "", self.text_ids if spoken else (),
                           tuple(map(tuple, self.codes)), usage, timings))
        self._close()
