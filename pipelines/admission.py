"""Admission: a new turn's works enter the stages only while the engine keeps the streams it speaks fed.

A committed turn waits while any stream already playing has less than FED_S of audio buffered but is still ahead of its
listener (the engine is not making audio faster than it is played: one more stream would starve them all); the waiting
turns then start together, oldest first, their prefills batched. A stream already behind is not helped by holding
newcomers back: it has no say. A turn never waits longer than MAX_WAIT_S: an engine that cannot keep even its present
streams fed serves everyone as best it can. Held turns run only behind committed work and are not queued here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

# audio a playing stream must have buffered for a new turn to start beside it (its listener's own start buffer
# comes on top); 0.05 s was tried: lower TTFA p95 within one call, more underruns across calls (RESULTS.md)
FED_S = 0.1
SETTLE_S = 0.0  # a stream that began playing less than this ago has no say (its first frame alone is under FED_S)
MAX_WAIT_S = 2.0


class Stream(Protocol):
    t_first_audio: float | None  # None: not playing yet

    def urgency(self) -> float:
        """Seconds of audio buffered (infinity for a turn that does not speak)."""


@dataclass
class Admission:
    max_wait_s: float = MAX_WAIT_S
    fed_s: float = FED_S
    settle_s: float = SETTLE_S
    queue: dict[str, tuple[float, Callable[[], None]]] = field(default_factory=dict)  # turn -> (since, start)
    waited: int = 0  # turns that started after waiting
    wait_s: float = 0.0  # seconds they waited, in all

    def offer(self, turn_id: str, start: Callable[[], None], streams: Iterable[Stream]) -> None:
        if not self.queue and self.fed(streams):
            start()
        else:
            self.queue[turn_id] = (time.perf_counter(), start)

    def admit(self, streams: Iterable[Stream]) -> None:
        now, ok = time.perf_counter(), self.fed(streams)
        for turn_id, (since, start) in list(self.queue.items()):
            if ok or now - since >= self.max_wait_s:
                del self.queue[turn_id]
                self.waited, self.wait_s = self.waited + 1, self.wait_s + now - since
                start()

    def drop(self, turn_id: str) -> None:
        self.queue.pop(turn_id, None)

    def counters(self) -> dict:
        return {"turns_waiting": len(self.queue), "turns_waited": self.waited, "admission_wait_s": self.wait_s}

    def fed(self, streams: Iterable[Stream]) -> bool:
        return not any(self._has_say(s) and 0 <= s.urgency() < self.fed_s for s in streams)

    def _has_say(self, s: Stream) -> bool:
        if s.t_first_audio is None:
            return False
        return self.settle_s <= 0 or time.perf_counter() - s.t_first_audio >= self.settle_s
