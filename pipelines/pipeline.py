"""Pipeline: the stage graph of one model, driven by one engine thread, with an asyncio-friendly API (`submit` a turn,
iterate its events; a held turn's events wait for `release` or go with `discard`: pipelines/held.py).

The engine thread owns every model, cache and work item; other threads only queue commands, so the gateway's asyncio
loop never blocks on a model step. Each iteration runs one batch of each stage in pipeline order, so a reply's first
frame can be decoded in the iteration that made it; an overlapping stage's decode (StageConfig.overlap) runs on the GPU
beside the later stages and hands its results on at the round's end."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from .held import Gate
from .program import Emit, StagedProgram
from .spec import ModelSpec
from .stage import Stage
from .types import AudioAhead, Event, Turn, TurnDone, TurnError

log = logging.getLogger(__name__)
T = TypeVar("T")
Outgoing = tuple[Callable[[Event], None], Event, Callable[[], None]]  # put it, the event, call if its loop is gone
__all__ = ["Emit", "Pipeline", "StagedProgram"]


class Pipeline:
    def __init__(self, program: StagedProgram, idle_wait_s: float = 0.05) -> None:
        self.program = program
        self.idle_wait_s = idle_wait_s
        self.play_ahead_s = 0.0  # >0: a stream that far ahead of its playback waits (Scheduler.schedule's ahead_s)
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._gates: dict[str, Gate] = {}  # held turns' gates, by turn id, until released or discarded
        self._lock = threading.Lock()
        self._engine_id: int | None = None
        # events the engine thread emitted in its current step, by listener loop: one wake-up of each loop a step,
        # not one a chunk (each a write to the loop's socket, where the sockets' thread may take the GIL)
        self._outbox: dict[asyncio.AbstractEventLoop, list[Outgoing]] = {}

    @property
    def spec(self) -> ModelSpec:
        return self.program.spec

    @property
    def stages(self) -> list[Stage]:
        return self.program.stages

    def start(self) -> Pipeline:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="omni-engine", daemon=True)
            self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._commands.put(lambda: None)
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the engine thread between steps."""
        self._commands.put(fn)

    def submit(self, turn: Turn, held: bool = False) -> AsyncIterator[Event]:
        """Start a turn; its events arrive in order and end with TurnDone or TurnError; closing the iterator
        early aborts it. A `held` turn's events arrive only after `release`, never after `discard`."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        gone = False

        def emit(event: Event) -> None:
            if gone:
                return
            if threading.get_ident() == self._engine_id:  # handed over at the end of the engine's step
                self._outbox.setdefault(loop, []).append((events.put_nowait, event, lost))
            else:
                self._deliver(loop, [(events.put_nowait, event, lost)])

        def lost() -> None:  # the listener's event loop has closed: nobody is reading any more
            nonlocal gone
            if not gone:
                gone = True
                self.abort(turn.turn_id)

        if held:
            gate = Gate(emit, held=True)
            with self._lock:
                self._gates[turn.turn_id] = gate
            self.call(lambda: self.program.start_turn(turn, gate, True))
        else:
            self.call(lambda: self.program.start_turn(turn, emit))
        return self._stream(turn.turn_id, events)

    async def _stream(self, turn_id: str, events: asyncio.Queue[Event]) -> AsyncIterator[Event]:
        finished = False
        try:
            while True:
                event = await events.get()
                finished = isinstance(event, TurnDone | TurnError)
                yield event
                if finished:
                    return
        finally:
            if not finished:
                self.abort(turn_id)

    def run(self, turn: Turn, timeout_s: float | None = None) -> list[Event]:
        """Blocking: every event of one turn (for the CLI and scripts)."""
        events: queue.Queue[Event] = queue.Queue()
        self.call(lambda: self.program.start_turn(turn, events.put))
        out: list[Event] = []
        while not out or not isinstance(out[-1], TurnDone | TurnError):
            out.append(events.get(timeout=timeout_s))
        return out

    def request(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn` on the engine thread between steps; its result (or exception) in a Future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as e:
                future.set_exception(e)

        self.call(run)
        return future

    # the program's methods, run on the engine thread (see StagedProgram for what each does)
    def stats(self, timeout_s: float = 30.0) -> dict:
        return self.request(self.program.counters).result(timeout_s)

    def capacity(self) -> dict[str, int]:
        return self.program.capacity()

    def kv_check(self, timeout_s: float = 30.0) -> dict[str, int]:
        return self.request(self.program.kv_check).result(timeout_s)

    def truncate_reply(self, session_id: str, turn_id: str, audio_end_ms: int) -> concurrent.futures.Future:
        return self.request(lambda: self.program.truncate_reply(session_id, turn_id, audio_end_ms))

    def audio_ahead(self) -> AudioAhead | None:
        return self.program.audio_ahead()

    def release(self, turn_id: str) -> concurrent.futures.Future[bool]:
        """Release a held turn: its waiting events flow now, from this thread, not after the engine's step."""
        self._gate(turn_id, Gate.release)
        return self.request(lambda: self.program.release_turn(turn_id))

    def discard(self, turn_id: str) -> concurrent.futures.Future[bool]:
        self._gate(turn_id, Gate.drop)
        return self.request(lambda: self.program.discard_turn(turn_id))

    def _gate(self, turn_id: str, action: Callable[[Gate], None]) -> None:
        with self._lock:
            gate = self._gates.pop(turn_id, None)
        if gate is not None:
            action(gate)

    def abort(self, turn_id: str) -> None:
        self.call(lambda: self.program.abort_turn(turn_id))

    def end_session(self, session_id: str) -> None:
        self.call(lambda: self.program.end_session(session_id))

    def sync(self, timeout_s: float = 30.0) -> None:
        """Wait until every command queued before this call has run."""
        done = threading.Event()
        self.call(done.set)
        if not done.wait(timeout_s):
            raise TimeoutError("engine did not answer")

    def _loop(self) -> None:
        self._engine_id = threading.get_ident()
        while not self._stop.is_set():
            try:
                self._iterate()
            except Exception:  # the engine thread must outlive any bug in one step
                log.exception("engine iteration failed")
            finally:
                self._flush()

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            self._deliver(loop, items)

    @staticmethod
    def _deliver(loop: asyncio.AbstractEventLoop, items: list[Outgoing]) -> None:
        def put() -> None:
            for put_event, event, _ in items:
                put_event(event)

        try:
            loop.call_soon_threadsafe(put)
        except RuntimeError:  # the loop has closed
            for _, _, lost in items:
                lost()

    def _iterate(self) -> None:
        self._drain()
        self.program.admit()
        self._flush()
        ran = self._round(False) or self._round(True)  # held turns run behind committed work
        if not ran:
            with contextlib.suppress(queue.Empty):
                self._commands.get(timeout=self.idle_wait_s)()

    def _drain(self) -> None:
        while True:
            try:
                fn = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except Exception:
                log.exception("engine command failed")

    def _round(self, held: bool) -> bool:
        """One batch of each stage in order; an overlapping stage's decode finishes after the others launched."""
        ran = False
        for stage in self.program.stages:
            ran |= self._guarded(stage, lambda s=stage: s.launch(held, self.play_ahead_s))
        for stage in self.program.stages:
            self._guarded(stage, stage.finish)
        return ran

    def _guarded(self, stage: Stage, fn: Callable[[], bool | None]) -> bool:
        try:
            return bool(fn())
        except Exception as e:  # the batch's turns got an error; the engine and every other turn go on
            log.exception("stage %s failed", stage.name)
            self.error = e
            return True
        finally:
            self._flush()  # what a stage's step emitted goes out as it ends, not at the round's end
