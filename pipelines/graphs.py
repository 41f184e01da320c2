"""The one graph runner: a fixed-shape step, captured once per batch bucket, replayed on padded batches.

A step is a pure function of tensors: it reads its inputs from static buffers (allocated once at the
largest bucket, each call writing its rows into the front of them) and returns its outputs. With
CUDA graphs on, each bucket's step is captured at start, largest first, into one shared memory pool;
a call copies the real rows in, pads the rest, replays, and returns the first n rows of the outputs
(cloned, since the next replay overwrites them). With graphs off (CPU, `--no-cuda-graphs`) the same
buffers and the same padding run eagerly, so both paths compute the same thing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
Tensors = dict[str, torch.Tensor]


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"batch of {n} rows exceeds the largest bucket {buckets[-1]}")


PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512)  # token counts of one sequence's fixed-shape prefill


@dataclass(frozen=True)
class Input:
    """A static input: per-row shape, dtype, and the value padding rows get. `rows` False: one value for
    the whole call (shape as given, e.g. the sequence's block table in a one-sequence prefill)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    pad: float | int | bool = 0
    rows: bool = True


class GraphRunner:
    def __init__(
        self, name: str, step: Callable[[Tensors], Tensors], inputs: Mapping[str, Input], device: torch.device,
        buckets: tuple[int, ...] = BUCKETS, graphs: bool = False,
    ) -> None:
        self.name, self.step, self.device = name, step, torch.device(device)
        self.buckets = buckets
        self.spec = dict(inputs)
        top = buckets[-1]
        self.buffers: Tensors = {
            k: torch.full((top, *s.shape) if s.rows else s.shape, s.pad, dtype=s.dtype, device=device)
            for k, s in inputs.items()
        }
        self.graphs_on = graphs and self.device.type == "cuda"
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensors]] = {}
        self.capture_s = 0.0
        self.calls = 0
        self.rows = 0  # real rows run (padding excluded)

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def views(self, b: int) -> Tensors:
        return {k: v[:b] if self.spec[k].rows else v for k, v in self.buffers.items()}

    def capture(self, pool: object | None = None) -> object | None:
        """Capture every bucket, largest first, sharing `pool` (returned for the next runner)."""
        if not self.graphs_on:
            return pool
        start = time.perf_counter()
        pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        for b in sorted(self.buckets, reverse=True):
            self._pad(0, b)
            views = self.views(b)
            with torch.cuda.stream(side):
                self.step(views)  # warm-up: lazy initialisation and compilation stay out of the graph
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.step(views)
            self.graphs[b] = (graph, out)
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - start
        log.info("%s: captured %d CUDA graphs in %.1f s", self.name, len(self.graphs), self.capture_s)
        return pool

    def __call__(self, n: int, rows: Mapping[str, torch.Tensor | np.ndarray | list]) -> Tensors:
        """Run n real rows: `rows[name]` holds their values of input `name` (each input must be given).
        Outputs with a row per bucket row come back as their first n rows, others whole."""
        b = bucket_for(n, self.buckets)
        for k, value in rows.items():
            dst = self.buffers[k][:n] if self.spec[k].rows else self.buffers[k]
            if isinstance(value, torch.Tensor):
                dst.copy_(value.reshape(dst.shape), non_blocking=True)
            else:
                src = torch.as_tensor(np.asarray(value), dtype=dst.dtype).reshape(dst.shape)
                dst.copy_(src.pin_memory() if self.device.type == "cuda" else src, non_blocking=True)
        self._pad(n, b)
        self.calls += 1
        self.rows += n
        if b in self.graphs:
            graph, out = self.graphs[b]
            graph.replay()
        else:
            out = self.step(self.views(b))
        return {k: (v[:n] if v.dim() and v.shape[0] == b else v).clone() for k, v in out.items()}

    def _pad(self, n: int, b: int) -> None:
        if n < b:
            for k, s in self.spec.items():
                if s.rows:
                    self.buffers[k][n:b].fill_(s.pad)
