"""The one graph runner: a fixed-shape step, captured once per batch bucket, replayed on padded batches.

A step is a pure function of static buffers (allocated at the largest bucket; a call writes its rows into
their front and pads the rest). With CUDA graphs on, each bucket is captured at start, largest first, into
one shared pool, and a call replays it and clones the first n output rows; with graphs off the same buffers
and padding run eagerly, so both paths compute the same thing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from .fastest import warming_up

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
Tensors = dict[str, torch.Tensor]


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"batch of {n} rows exceeds the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class Input:
    """A static input: per-row shape, dtype, and the value padding rows get."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    pad: float | int | bool = 0


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
            k: torch.full((top, *s.shape), s.pad, dtype=s.dtype, device=device) for k, s in inputs.items()
        }
        self.graphs_on = graphs and self.device.type == "cuda"
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensors]] = {}
        self.capture_s = 0.0

    def views(self, b: int) -> Tensors:
        return {k: v[:b] for k, v in self.buffers.items()}

    def capture(self, pool: object | None = None) -> object | None:
        """Capture every bucket, largest first, sharing `pool` (returned for the next runner), on the current
        stream (a new one in place of the default stream): graphs replayed at once on different streams must
        have been captured on different streams, whose cuBLAS workspaces differ, in different pools."""
        if not self.graphs_on:
            return pool
        start = time.perf_counter()
        pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        stream = torch.cuda.current_stream(self.device)
        if stream == torch.cuda.default_stream(self.device):
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
        for b in sorted(self.buckets, reverse=True):
            with torch.cuda.stream(stream):
                self._pad(0, b)
                views = self.views(b)
                with warming_up():  # lazy initialisation, compilation and choosing ways stay out of the graph
                    self.step(views)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = self.step(views)
            self.graphs[b] = (graph, out)
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - start
        log.info("%s: captured %d CUDA graphs in %.1f s", self.name, len(self.graphs), self.capture_s)
        return pool

    def __call__(self, n: int, rows: Mapping[str, torch.Tensor | np.ndarray | list]) -> Tensors:
        """Run n real rows: `rows[name]` holds their values of input `name` (each input must be given)."""
        b = bucket_for(n, self.buckets)
        for k, value in rows.items():
            dst = self.buffers[k][:n]
            if isinstance(value, torch.Tensor):
                dst.copy_(value.reshape(dst.shape), non_blocking=True)
            else:
                src = torch.as_tensor(np.asarray(value), dtype=dst.dtype).reshape(dst.shape)
                dst.copy_(src.pin_memory() if self.device.type == "cuda" else src, non_blocking=True)
        self._pad(n, b)
        if b in self.graphs:
            graph, out = self.graphs[b]
            graph.replay()
        else:
            out = self.step(self.views(b))
        return {k: v[:n].clone() for k, v in out.items()}

    def _pad(self, n: int, b: int) -> None:
        if n < b:
            for k, s in self.spec.items():
                self.buffers[k][n:b].fill_(s.pad)


class PrefillGraphs:
    """Fixed-shape prefills: up to ROWS[-1] sequences per call, each padded to a token bucket and attending
    over a context bucket; one GraphRunner per shape."""

    TOKENS = (32, 64, 96, 128, 512)  # new tokens per sequence (96: a first turn of a 3 s question is 86)
    CONTEXTS = (1024, 4096)  # cached + new tokens per sequence
    ROWS = (1, 2, 4, 8)

    def __init__(self, name: str, step: Callable[[Tensors], Tensors], inputs: Callable[[int, int], dict[str, Input]],
                 block_size: int, device: torch.device, graphs: bool) -> None:
        self.runners = {
            (t, c): GraphRunner(f"{name}[{t}x{c}]", step, inputs(t, c // block_size), device, self.ROWS, graphs)
            for t in self.TOKENS for c in self.CONTEXTS
        }

    def capture(self, pool: object | None) -> object | None:
        for runner in self.runners.values():
            pool = runner.capture(pool)
        return pool

    def shape(self, new: int, context: int) -> tuple[int, int] | None:
        """The smallest (tokens, context) buckets that hold a sequence, or None (it runs eagerly)."""
        t = next((t for t in self.TOKENS if t >= new), None)
        c = next((c for c in self.CONTEXTS if c >= context), None)
        return None if t is None or c is None else (t, c)

    def groups(self, items: list[tuple[object, tuple[int, int]]]) -> list[tuple[tuple[int, int], list]]:
        """Items with their shapes -> (shape, items) calls of at most ROWS[-1] items each."""
        by_shape: dict[tuple[int, int], list] = {}
        for item, shape in items:
            by_shape.setdefault(shape, []).append(item)
        top = self.ROWS[-1]
        return [(shape, group[i : i + top]) for shape, group in by_shape.items() for i in range(0, len(group), top)]
