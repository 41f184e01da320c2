"""ModelRunner: runs one scheduled batch of a stage through its model on the stage's device.

The model's part is its `StepModel`; the runner picks the fixed-shape decode when the model has one, else the paged KV
view for exactly these rows, then commits the cached lengths and times the step."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import torch

from .kv_cache import PagedKVCache
from .scheduler import Batch, Work


class StepModel(Protocol):
    def run(self, works: list[Work], lengths: list[int], prefill: bool) -> None:
        """Feed each work's next `lengths[i]` pending inputs, sample, and hand results on (any shapes)."""


Finish = Callable[[], None]


class DecodeModel(StepModel, Protocol):
    """A StepModel with a fixed-shape step for one new input per row (captured as CUDA graphs)."""

    def decode(self, works: list[Work]) -> Finish | None:
        """Launch the batch through the fixed-shape step; return what reads its results back and hands them on (called
        at once, or after the next stages launched: StageConfig.overlap), or None (nothing done) if it cannot."""

    def capture(self, pool: object | None) -> object | None:
        """Capture the fixed-shape steps (when graphs are on), sharing the memory pool `pool`."""


class ModelRunner:
    def __init__(self, model: StepModel, kv: PagedKVCache | None, device: torch.device | str, name: str = "") -> None:
        self.model = model
        self.name = f"stage:{name}"
        self.kv = kv
        self.device = torch.device(device)
        self.steps = self.rows = 0  # batches run, and the rows in them
        self.busy_s = 0.0

    def capture(self, pool: object | None) -> object | None:
        capture = getattr(self.model, "capture", None)
        if capture is None:
            return pool
        with torch.inference_mode():
            return capture(pool)

    def run(self, batch: Batch) -> Finish | None:
        """Run a batch; a decode may leave its results to the Finish returned."""
        start = time.perf_counter()
        with torch.inference_mode(), self._label():
            decode = getattr(self.model, "decode", None)
            finish = None if batch.prefill or decode is None else decode(batch.works)
            if finish is None:
                self.model.run(batch.works, batch.lengths, batch.prefill)
            if self.kv is not None:
                for w, n in zip(batch.works, batch.lengths, strict=True):
                    if self.kv.has(w.key):
                        self.kv.commit(w.key, n)
        self.steps, self.rows = self.steps + 1, self.rows + len(batch.works)
        self.busy_s += time.perf_counter() - start
        return None if finish is None else lambda: self._timed(finish)

    def _label(self) -> AbstractContextManager:
        """The stage's range in a torch.profiler trace (profile_turn.py reads them); none while no profiler runs:
        entering one is two torch calls, each a chance for another thread to keep the GIL."""
        return torch.profiler.record_function(self.name) if torch.autograd._profiler_enabled() else nullcontext()

    def _timed(self, finish: Finish) -> None:
        start = time.perf_counter()
        with torch.inference_mode(), self._label():
            finish()
        self.busy_s += time.perf_counter() - start
