"""What every speaking turn does the same way, whatever its model: a turn state's frame, audio, failure and
close handling (`SpeakingState`, a mixin over the model's own dataclass fields) and the frame stage's work
item (`FrameWork`: its inputs, the codec part of its next input and its repetition-penalty slot)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pipelines.kv_cache import PagedKVCache
from pipelines.types import AudioChunk, Event, TurnError

from .rows import Rows
from .work import Turn, Work

TEXT_LEAD = 6  # reply tokens the writer may run ahead of the frame stage reading them (one per frame)


@dataclass(kw_only=True)
class SpeakingState:
    """Its own fields, and the subclass's (a dataclass): turn_id, session, options (max_frames), emit_event, rate."""

    on_close: Callable[[], None] = lambda: None
    codes: list[list[int]] = field(default_factory=list)
    frames_out: list[torch.Tensor] = field(default_factory=list)  # [16] codes waiting for the codec
    talker_done: bool = False
    audio_stop: str = "completed"
    audio_done: bool = False
    audio_samples: int = 0
    finished: bool = False
    held: bool = False  # started before the commit: runs behind committed work, events held back
    t_start: float = field(default_factory=time.perf_counter)
    t_first_audio: float | None = None
    marks: dict[str, float] = field(default_factory=dict)  # timings key ("first_text_ms") -> when first reached

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.perf_counter())

    def emit(self, event: Event) -> None:
        if not self.finished:
            self.emit_event(event)

    def audio_urgency(self) -> float:
        """Seconds of audio the listener still has buffered; before the first audio, minus the wait."""
        now = time.perf_counter()
        if self.t_first_audio is None:
            return self.t_start - now
        return self.audio_samples / self.rate - (now - self.t_first_audio)

    def on_frame(self, codes: list[int], row: torch.Tensor, embed_sum: torch.Tensor, eos: int) -> torch.Tensor | None:
        """A codec frame from the talker; returns the codec part of the talker's next input, if any."""
        if codes[0] == eos:
            self.talker_done = True
            return None
        self.mark("first_frame_ms")
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

    def timings(self, now: float) -> dict[str, float]:
        """total_ms, each mark's ms after the start, first_audio_ms, and rtf once there is audio."""
        marks = {"total_ms": now, **self.marks, "first_audio_ms": self.t_first_audio}
        out = {k: (t - self.t_start) * 1e3 for k, t in marks.items() if t is not None}
        if self.audio_samples:
            out["rtf"] = (now - self.t_start) / (self.audio_samples / self.rate)
        return out


class FrameWork(Work):
    """A turn's stream in the frame stage; its first inputs come from the model's prompt rules."""

    def __init__(self, turn: Turn, kv: PagedKVCache) -> None:
        super().__init__(turn, f"talker:{turn.turn_id}")
        self.kv = kv
        self.inputs = Rows()
        self.next_embed: torch.Tensor | None = None  # codec part of the next input, once a frame is made
        self.next: tuple[torch.Tensor, torch.Tensor] | None = None  # the next input's codec and text parts
        self.steps = 0  # decode inputs taken; `slot`: its row of the stage's repetition-penalty state

    def feed(self, text: torch.Tensor) -> None:
        """The next input is the last frame's codec part plus `text`: the stage adds them for all its rows at
        once (one op a step, not one a row)."""
        self.next, self.next_embed, self.steps = (self.next_embed, text), None, self.steps + 1

    def unfed(self) -> int:
        """Inputs the stage has yet to run, the one waiting for its add included."""
        return self.inputs.n + (self.next is not None) - self.kv.length(self.key)

    def unread(self, written: int) -> int:
        """How many of a writer's `written` reply tokens this stream has yet to read (its prompt holds token 0,
        each later input one more)."""
        return written - (self.steps + 1 if self.inputs.n else 0)

    def paces(self, written: int) -> bool:
        """Whether a writer with `written` reply tokens waits for this stream, which still reads: the stream has not
        taken its prompt yet (it starts on token 0; the writer's next step would share the GPU with its prefill, on
        the way to the first audio), or the writer is TEXT_LEAD ahead of what it has read."""
        t = self.turn
        return (self.inputs.n == 0 or self.unread(written) >= TEXT_LEAD) and t.speaking and \
            not (t.talker_done or t.finished)
