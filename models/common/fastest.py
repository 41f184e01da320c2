"""Per shape, the fastest of several ways to compute the same thing on CUDA, timed at the shape's first call."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

_CHOICE: dict[Hashable, int] = {}
CALLS, REPS = 10, 3  # calls a timing graph holds, replays timed


def fastest(key: Hashable, ways: Callable[[], Sequence[Callable[[], torch.Tensor]]]) -> int:
    """The index of the fastest of `ways()` for `key`, timed once (the ways are built only then). While a CUDA
    graph is being captured an untimed key gets way 0 (timing syncs): the capture's eager warm-up times the shapes
    it will capture."""
    if key not in _CHOICE:
        if torch.cuda.is_current_stream_capturing():
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
