"""Held turns: a turn that runs (encode, prefill, generate) while its events wait, to be released or discarded.

A gateway starts one when the user has probably finished speaking but not committed; on the commit it releases it, and
if the user goes on speaking it discards it (aborted, events dropped, the session rolled back by the model's `mark` /
`roll_back`). Held work runs only in iterations where no committed work ran."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .types import Event

Emit = Callable[[Event], None]


@dataclass
class Gate:
    """Passes a turn's events on, or keeps them while held; a dropped gate passes nothing. Thread-safe: the
    engine emits into it while the gateway releases it."""

    emit: Emit
    held: bool = False
    dropped: bool = False
    waiting: list[Event] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, event: Event) -> None:
        with self.lock:
            if self.dropped:
                return
            if self.held:
                self.waiting.append(event)
            else:
                self.emit(event)

    def release(self) -> None:
        with self.lock:
            if self.dropped:
                return
            self.held = False
            events, self.waiting = self.waiting, []
            for event in events:
                self.emit(event)

    def drop(self) -> None:
        with self.lock:
            self.dropped, self.waiting = True, []


@dataclass
class HeldTurn:
    """One held turn: its gate, and what its session was before it (None: the session was new)."""

    turn_id: str
    session_id: str
    gate: Gate
    mark: object | None
    ended: int = 0  # its TurnDone / TurnError, counted once made (uncounted if it is discarded)
