"""Per shape, the fastest of several ways to compute the same thing on CUDA, timed at the shape's first call."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

_CHOICE: dict[Hashable, int] = {}


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


def _time(fn: Callable[[], torch.Tensor], reps: int = 5) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)
