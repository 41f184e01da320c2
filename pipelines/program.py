"""A model's side of the pipeline: the turn bookkeeping every model shares (`StagedProgram`), driven by Pipeline.

A model subclasses StagedProgram and writes what is its own (`new_session`, `prepare`, `truncate_reply`, `mark` /
`roll_back`, extra counters); the turn lifecycle, counting and KV checks live here once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import torch

from .admission import Admission
from .held import Gate, HeldTurn
from .spec import ModelSpec
from .stage import Stage
from .types import AudioAhead, Event, Turn, TurnDone, TurnError

log = logging.getLogger(__name__)
Emit = Callable[[Event], None]
TYPICAL_SESSION_TOKENS = 2048  # a few turns of speech: what the session capacity counts in


class ContextTooLong(ValueError):
    """A turn that cannot fit in the model's context (refused as `context_too_long`)."""


class TurnHandle(Protocol):
    """What the bookkeeping needs of a model's per-turn state."""

    finished: bool
    held: bool  # its works run only behind committed work (pipelines/held.py)
    on_close: Callable[[], None]
    t_first_audio: float | None  # when its first audio was made (None: not yet, or it does not speak)

    def urgency(self) -> float: ...

    def mark(self, name: str) -> None:
        """Note when the turn first reached milestone `name` (its TurnDone's timings carry it)."""

    def finish(self, status: str) -> None: ...

    def fail(self, code: str, message: str) -> None: ...


class SessionHandle(Protocol):
    kv_key: str  # its conversation's sequence in the session stage's cache
    turn: TurnHandle | None


class StagedProgram:
    """What the Pipeline drives: a model's stages (in pipeline order) and how a turn moves through them.
    `session_stage`: the stage whose KV cache keeps each conversation between turns (capacity counts it)."""

    def __init__(self, spec: ModelSpec, stages: list[Stage], session_stage: str) -> None:
        self.spec = spec
        self.stages = stages
        self.by_name = {s.name: s for s in stages}
        self.session_stage = session_stage
        self.sessions: dict[str, SessionHandle] = {}
        self.turns: dict[str, tuple[TurnHandle, list[tuple[Stage, object]]]] = {}
        self.started = self.ended = 0
        self.held: dict[str, HeldTurn] = {}
        self.released = self.discarded = 0
        self.admission = Admission()

    def new_session(self, session_id: str) -> SessionHandle:
        raise NotImplementedError

    def prepare(self, session: SessionHandle, turn: Turn, emit: Emit) -> tuple[TurnHandle, list[tuple[Stage, object]]]:
        """The turn's state and works, or ContextTooLong / ValueError (the request's fault; anything else fails
        that turn alone). Nothing of the session may change before the last thing that can fail."""
        raise NotImplementedError

    def extra_counters(self) -> dict:
        return {}

    def audio_ahead(self) -> AudioAhead | None:
        """A new encoder of one audio as it arrives (push from one thread, then Message.ahead), or None."""
        return None

    def mark(self, session: SessionHandle) -> object:
        """What `roll_back` needs to return the session to this moment (taken before a held turn)."""
        raise NotImplementedError

    def roll_back(self, session: SessionHandle, mark: object, turn_id: str) -> None:
        """Undo everything turn `turn_id` (ended) did to the session: inputs, replies, KV, to `mark`."""
        raise NotImplementedError

    def truncate_reply(self, session_id: str, turn_id: str, audio_end_ms: int) -> tuple[str, bool]:
        """Cut a reply to its first `audio_end_ms` of audio: (heard text, whether the cache rolled back)."""
        raise NotImplementedError

    def capture(self) -> float:
        start = time.perf_counter()
        for stage in self.stages:
            stage.capture()
        seconds = time.perf_counter() - start
        if any(s.stream is not None for s in self.stages):
            log.info("CUDA graphs captured in %.1f s", seconds)
        return seconds

    def start_turn(self, turn: Turn, emit: Emit, held: bool = False) -> None:
        """Register a turn's works, or refuse it (TurnError) before any exist; every turn started here ends with exactly
        one TurnDone or TurnError. One held turn per session; a held Gate as `emit` releases its events elsewhere."""
        self.started += 1
        gate = emit if isinstance(emit, Gate) else Gate(emit, held)
        entry: HeldTurn | None = None

        def counted(event: Event) -> None:
            if isinstance(event, TurnDone | TurnError):
                self.ended += 1
                if entry is not None:
                    entry.ended += 1
            gate(event)

        session = self.sessions.get(turn.session_id) or self.new_session(turn.session_id)
        if session.turn is not None or any(h.session_id == turn.session_id for h in self.held.values()):
            gate.release()  # a refusal is never held
            counted(TurnError(turn.turn_id, "session_busy", f"session {turn.session_id} already has an active turn"))
            return
        if held:
            mark = self.mark(session) if turn.session_id in self.sessions else None
            entry = self.held[turn.turn_id] = HeldTurn(turn.turn_id, turn.session_id, gate, mark)
        try:
            with torch.inference_mode():
                state, works = self.prepare(session, turn, counted)
        except ContextTooLong as e:
            return counted(TurnError(turn.turn_id, "context_too_long", str(e)))
        except ValueError as e:
            return counted(TurnError(turn.turn_id, "invalid_request", str(e)))
        except Exception as e:  # a bug in preparing one turn fails that turn alone
            log.exception("preparing turn %s failed", turn.turn_id)
            return counted(TurnError(turn.turn_id, "internal_error", f"{type(e).__name__}: {e}"))
        self.sessions[turn.session_id] = session
        session.turn = state
        state.held = held
        self.turns[turn.turn_id] = (state, works)
        state.on_close = lambda: self._close(turn.turn_id)

        def register() -> None:
            state.mark("admitted_ms")
            try:
                for stage, work in works:
                    stage.add(work)
            except Exception as e:
                log.exception("registering turn %s failed", turn.turn_id)
                state.fail("internal_error", f"{type(e).__name__}: {e}")

        if held:  # it runs only behind committed work: never queued
            register()
        else:
            self.admission.offer(turn.turn_id, register, self._streams())

    def admit(self) -> None:
        """Start the waiting turns whose time has come (pipelines/admission.py); once per engine iteration."""
        if self.admission.queue:  # the streams are listed only when a turn waits
            self.admission.admit(self._streams())

    def _streams(self) -> list[TurnHandle]:
        return [state for turn_id, (state, _) in self.turns.items() if turn_id not in self.admission.queue]

    def release_turn(self, turn_id: str) -> bool:
        """A held turn becomes committed: its waiting events flow, then live ones. Whether it was held."""
        entry = self.held.pop(turn_id, None)
        if entry is None:
            return False
        if turn_id in self.turns:
            self.turns[turn_id][0].held = False
        self.released += 1
        entry.gate.release()
        return True

    def discard_turn(self, turn_id: str) -> bool:
        """Abort a held turn, emitting none of its events, and undo it (session, KV cache, slots, counters)."""
        entry = self.held.pop(turn_id, None)
        if entry is None:
            return False
        entry.gate.drop()
        if turn_id in self.turns:
            self.turns[turn_id][0].finish("cancelled")  # its works leave; their slots and stream caches go
        session = self.sessions.get(entry.session_id)
        if session is not None:
            with torch.inference_mode():
                if entry.mark is None:  # the session began with this turn
                    self.sessions.pop(entry.session_id)
                    self.by_name[self.session_stage].kv.release(session.kv_key)
                else:
                    self.roll_back(session, entry.mark, turn_id)
        self.started -= 1
        self.ended -= entry.ended
        self.discarded += 1
        return True

    def abort_turn(self, turn_id: str) -> None:
        entry = self.turns.get(turn_id)
        if entry is not None:
            entry[0].finish("cancelled")

    def end_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        for turn_id in [t for t, h in self.held.items() if h.session_id == session_id]:
            self.held.pop(turn_id).gate.drop()
        if session.turn is not None:
            session.turn.finish("cancelled")
        self.by_name[self.session_stage].kv.release(session.kv_key)

    def _close(self, turn_id: str) -> None:
        self.admission.drop(turn_id)
        _, works = self.turns.pop(turn_id, (None, []))
        for stage, work in works:
            stage.remove(work)
            with torch.inference_mode():  # its state rows are inference tensors
                work.release()

    def counters(self) -> dict:
        """Plain numbers for tests (what returns to zero) and /metrics."""
        return {
            "turns_started": self.started, "turns_ended": self.ended, "turns_active": len(self.turns),
            "sessions": len(self.sessions), "held": len(self.held),
            "held_released": self.released, "held_discarded": self.discarded,
            "kv_blocks": self._blocks_used(), **self.admission.counters(),
            "works": {s.name: len(s.scheduler.works) for s in self.stages},
            **self.extra_counters(),
            "kv_capacity": self.capacity(),
        }

    def capacity(self, typical_tokens: int = TYPICAL_SESSION_TOKENS) -> dict[str, int]:
        """Tokens each KV cache holds, and how many conversations of `typical_tokens` fit at once."""
        tokens = {s.name: s.kv.layout.num_blocks * s.kv.layout.block_size for s in self.stages if s.kv is not None}
        sessions = tokens[self.session_stage] // typical_tokens
        return {**{f"{n}_tokens": t for n, t in tokens.items()}, "sessions": sessions}

    def kv_check(self) -> dict[str, int]:
        for stage in self.stages:
            if stage.kv is not None:
                stage.kv.check()
        return self._blocks_used()

    def _blocks_used(self) -> dict[str, int]:
        return {s.name: s.kv.layout.num_blocks - s.kv.num_free for s in self.stages if s.kv is not None}
