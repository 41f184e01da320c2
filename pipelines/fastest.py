"""Per shape, the fastest of several ways to compute the same thing on CUDA, timed in a graph runner's warm-up.

A shape is timed only within `warming_up()` (graphs.GraphRunner.capture's eager step before each capture), so
every captured step runs its shapes' fastest ways. Anywhere else an untimed shape takes way 0 at once: timing it,
and compiling the kernels its ways launch (0.3-2 s each with Triton 3.6), would stop a live engine's step."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager

import torch

_CHOICE: dict[Hashable, int] = {}
_LOCAL = threading.local()
CALLS, REPS = 10, 3  # calls a timing graph holds, replays timed


@contextmanager
def warming_up() -> Iterator[None]:
    """Within: an untimed shape is timed (on CUDA, outside a capture)."""
    before, _LOCAL.on = getattr(_LOCAL, "on", False), True
    try:
        yield
    finally:
        _LOCAL.on = before


def fastest(key: Hashable, ways: Callable[[], Sequence[Callable[[], torch.Tensor]]]) -> int:
    """The index of the fastest of `ways()` for `key` once timed (the ways are built only then), else 0."""
    if key not in _CHOICE:
        if not getattr(_LOCAL, "on", False) or torch.cuda.is_current_stream_capturing():
            return 0
        times = [_time(way) for way in ways()]
        _CHOICE[key] = times.index(min(times))
    return _CHOICE[key]


def _time(fn: Callable[[], torch.Tensor]) -> float:
    """GPU milliseconds a call, replayed from a CUDA graph as the steps run: timed eagerly, a few-microsecond
    kernel measures its launch (a Triton launch costs more host time than cuBLAS's), not its work. Captured on a
    stream of its own, without torch.cuda.graph's device-wide sync: other stages' streams may be running."""
    fn()  # compiles and allocates outside the capture
    here, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(here)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            for _ in range(CALLS):
                fn()
        finally:
            graph.capture_end()
    here.wait_stream(side)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (CALLS * REPS)
