"""ModelRunner: runs one scheduled batch of a stage through its model on the stage's device.

The model-specific part (what goes in, what comes out) is the stage's `StepModel`, written beside the
model (models/<name>/stages.py). The runner owns how the forward runs: inference mode, the fixed-shape
decode path when the model has one (its static buffers and CUDA graphs are pipelines.graphs'), else
the paged KV view for exactly these rows; committing the cached lengths afterwards; and timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from .kv_cache import BatchKV, PagedKVCache
from .scheduler import Batch, Work


class StepModel(Protocol):
    def run(self, works: list[Work], lengths: list[int], kv: BatchKV | None, prefill: bool) -> None:
        """Feed each work's next `lengths[i]` pending inputs, sample, and hand results on (any shapes)."""
        ...


class DecodeModel(StepModel, Protocol):
    """A StepModel with a fixed-shape step for one new input per row (captured as CUDA graphs)."""

    def decode(self, works: list[Work]) -> Callable[[], None] | None:
        """Launch the batch through the fixed-shape step and return its commit (the host part, after
        the step's one device-to-host copy); None, with nothing done, when it cannot take the batch."""
        ...

    def capture(self, pool: object | None) -> object | None:
        """Capture the fixed-shape steps (when graphs are on), sharing the memory pool `pool`."""
        ...


class ModelRunner:
    def __init__(self, model: StepModel, kv: PagedKVCache | None, device: torch.device | str, name: str = "") -> None:
        self.model = model
        self.name = f"stage:{name}"
        self.kv = kv
        self.device = torch.device(device)
        self.steps = 0
        self.busy_s = 0.0  # launch to commit, summed over steps (overlapping steps both count)
        self.graph_steps = 0  # steps that ran the fixed-shape path

    def capture(self, pool: object | None) -> object | None:
        capture = getattr(self.model, "capture", None)
        if capture is None:
            return pool
        with torch.inference_mode():
            return capture(pool)

    def run(self, batch: Batch) -> Callable[[], None] | None:
        """Run one batch. A fixed-shape decode comes back launched: the returned function commits it
        (the caller may launch another stage's step first); otherwise the batch is done (None)."""
        start = time.perf_counter()
        with torch.inference_mode(), torch.profiler.record_function(self.name):
            decode = getattr(self.model, "decode", None)
            commit = decode(batch.works) if decode is not None and not batch.prefill else None
            if commit is None:
                view = None
                if self.kv is not None:
                    view = self.kv.batch([(w.key, n) for w, n in zip(batch.works, batch.lengths, strict=True)])
                self.model.run(batch.works, batch.lengths, view, batch.prefill)
                self._done(batch, start)
                return None
        self.graph_steps += 1

        def finish() -> None:
            with torch.inference_mode():
                commit()
            self._done(batch, start)

        return finish

    def _done(self, batch: Batch, start: float) -> None:
        if self.kv is not None:
            for w, n in zip(batch.works, batch.lengths, strict=True):
                if self.kv.has(w.key):
                    self.kv.commit(w.key, n)
        self.steps += 1
        self.busy_s += time.perf_counter() - start
