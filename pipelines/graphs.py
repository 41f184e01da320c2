"""The one graph runner: a fixed-shape step, captured once per batch bucket, replayed on padded batches.

A step is a pure function of static buffers (allocated at the largest bucket; a call writes its rows into
their front and pads the rest). With CUDA graphs on, each bucket is captured at start, largest first, into
one shared pool, and a call replays it and clones the first n output rows; with graphs off the same buffers
and padding run eagerly, so both paths compute the same thing.

The inputs that come from the host live in one device buffer, written by one copy a call from a pinned staging
buffer that numpy fills (rows and padding): every torch call lets the sockets' thread take the GIL, so a step's
inputs cost one call, not three an input. Two staging buffers alternate, each reused only once its last copy ran.
"""

from __future__ import annotations

import logging
import math
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
    on_device: bool = False  # its values come as device tensors (else from the host, packed into the one copy)

    def nbytes(self, rows: int) -> int:
        return rows * math.prod(self.shape) * self.dtype.itemsize


ALIGN = 64  # bytes: each packed input starts here, so any dtype can view it


@dataclass
class Staging:
    """Host memory laid out as the packed device buffer, an array view per input, and the event that marks its
    last copy done."""

    raw: torch.Tensor  # uint8, pinned on CUDA
    arrays: dict[str, np.ndarray | torch.Tensor]  # numpy views; a torch view where numpy lacks the dtype (bfloat16)
    copied: torch.cuda.Event | None = None  # (an event never recorded counts as done)

    def put(self, name: str, n: int, b: int, value: torch.Tensor | np.ndarray | list | None,
            pad: float | int | bool) -> None:
        """Rows [0, n) of input `name` from `value` (None: they come by another copy), rows [n, b) padding."""
        dst = self.arrays[name]
        if isinstance(dst, torch.Tensor) and value is not None:
            value = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
            dst[:n].copy_(value.reshape(dst[:n].shape))
        elif value is not None:
            if isinstance(value, torch.Tensor):  # (numpy has no bfloat16)
                value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
            dst[:n] = np.asarray(value).reshape(dst[:n].shape)
        dst[n:b] = pad


class GraphRunner:
    def __init__(
        self, name: str, step: Callable[[Tensors], Tensors], inputs: Mapping[str, Input], device: torch.device,
        buckets: tuple[int, ...] = BUCKETS, graphs: bool = False,
    ) -> None:
        self.name, self.step, self.device = name, step, torch.device(device)
        self.buckets = buckets
        self.spec = dict(inputs)
        top = buckets[-1]
        offsets, size = {}, 0
        for k, s in self.spec.items():
            if not s.on_device:
                offsets[k] = size
                size += -(-s.nbytes(top) // ALIGN) * ALIGN
        self.packed = torch.zeros(size, dtype=torch.uint8, device=device)  # the host inputs, one after another
        self.packed_bytes = size  # (a plain int: asking the tensor is a torch call each step)
        self.buffers: Tensors = {
            k: self._packed_view(self.packed, offsets[k], s, top) if k in offsets else
            torch.empty((top, *s.shape), dtype=s.dtype, device=device) for k, s in self.spec.items()
        }
        self._pad(0, top)
        self.offsets = offsets  # where each host input sits in `packed` (and in a staging buffer)
        self.stagings: list[Staging | None] = [None, None]  # made at first use (a one-off eager runner needs one)
        self.next_staging = 0  # which of the two the next call fills
        self.graphs_on = graphs and self.device.type == "cuda"
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensors]] = {}
        self.capture_s = 0.0

    def views(self, b: int) -> Tensors:
        return {k: v[:b] for k, v in self.buffers.items()}

    @staticmethod
    def _packed_view(raw: torch.Tensor, offset: int, s: Input, rows: int) -> torch.Tensor:
        return raw[offset : offset + s.nbytes(rows)].view(s.dtype).view(rows, *s.shape)

    def _staging(self) -> Staging:
        pin = self.device.type == "cuda" and self.packed_bytes > 0
        raw = torch.zeros(self.packed_bytes, dtype=torch.uint8, pin_memory=pin)
        arrays: dict[str, np.ndarray | torch.Tensor] = {}
        for k, offset in self.offsets.items():
            view = self._packed_view(raw, offset, self.spec[k], self.buckets[-1])
            arrays[k] = view if view.dtype == torch.bfloat16 else view.numpy()
        return Staging(raw, arrays, torch.cuda.Event() if pin else None)

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
        missing = self.spec.keys() - rows.keys()
        if missing:
            raise ValueError(f"{self.name}: no values for input(s) {sorted(missing)}")
        staging = self._next_staging()
        on_device = []
        for k, value in rows.items():
            spec = self.spec[k]
            if spec.on_device or isinstance(value, torch.Tensor) and value.device.type != "cpu":
                on_device.append((k, value))
                value = None
            if not spec.on_device:
                staging.put(k, n, b, value, spec.pad)
        if self.packed_bytes:
            self.packed.copy_(staging.raw, non_blocking=True)
            if staging.copied is not None:
                staging.copied.record(torch.cuda.current_stream(self.device))  # the copy's stream (cuda:N too)
        for k, value in on_device:  # after the packed copy, in stream order
            dst = self.buffers[k]
            src = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value), dtype=dst.dtype)
            view = dst[:n]
            view.copy_(src if src.shape == view.shape else src.reshape(view.shape), non_blocking=True)
            if n < b and self.spec[k].on_device:  # a host input's padding came with the packed copy
                dst[n:b].fill_(self.spec[k].pad)
        if b in self.graphs:
            graph, out = self.graphs[b]
            graph.replay()
        else:
            out = self.step(self.views(b))
        return {k: v[:n].clone() for k, v in out.items()}

    def _next_staging(self) -> Staging:
        """The staging buffer whose copy ran longest ago, once that copy is done (it is, but for a step that never
        synced)."""
        i = self.next_staging
        staging = self.stagings[i] = self.stagings[i] or self._staging()
        self.next_staging = 1 - i
        if staging.copied is not None:
            staging.copied.synchronize()
        return staging

    def _pad(self, n: int, b: int) -> None:
        if n < b:
            for k, s in self.spec.items():
                self.buffers[k][n:b].fill_(s.pad)


class PrefillGraphs:
    """Fixed-shape prefills: up to ROWS[-1] sequences per call, each padded to a token bucket and attending
    over a context bucket; one GraphRunner per shape."""

    TOKENS = (32, 64, 96, 128, 512)  # new tokens per sequence (96: a first turn of a 3 s question is 86)
    CONTEXTS = (256, 1024, 4096)  # cached + new tokens (256 for first turns: burst p95 203-222 ms, not 257-280)
    ROWS = (1, 2, 4, 8, 16)  # 16: a burst round's dozen new turns in one call (burst p95 366-408 ms, 413-418 at 8)

    def __init__(self, name: str, step: Callable[[Tensors], Tensors], inputs: Callable[[int, int], dict[str, Input]],
                 block_size: int, device: torch.device, graphs: bool) -> None:
        self.runners = {
            (t, c): GraphRunner(f"{name}[{t}x{c}]", step, inputs(t, c // block_size), device, self.ROWS, graphs)
            for t in self.TOKENS for c in self.CONTEXTS if t <= c
        }

    def capture(self, pool: object | None) -> object | None:
        for runner in self.runners.values():
            pool = runner.capture(pool)
        return pool

    def shape(self, new: int, context: int) -> tuple[int, int] | None:
        """The smallest (tokens, context) buckets that hold a sequence, or None (it runs eagerly); no narrower
        context than tokens (those shapes are not made)."""
        t = next((t for t in self.TOKENS if t >= new), None)
        c = next((c for c in self.CONTEXTS if c >= max(context, t or 0)), None)
        return None if t is None or c is None else (t, c)

    def groups(self, items: list[tuple[object, tuple[int, int]]]) -> list[tuple[tuple[int, int], list]]:
        """Items with their shapes -> (shape, items) calls of at most ROWS[-1] items each: one token bucket a call,
        each call at the widest context among its items (one call, not one per context), wider contexts first so that
        the narrower ones are left together."""
        by_tokens: dict[int, list[tuple[object, int]]] = {}
        for item, (t, c) in sorted(items, key=lambda it: -it[1][1]):
            by_tokens.setdefault(t, []).append((item, c))
        top = self.ROWS[-1]
        calls = [(t, group[i : i + top]) for t, group in by_tokens.items() for i in range(0, len(group), top)]
        return [((t, max(c for _, c in call)), [item for item, _ in call]) for t, call in calls]
