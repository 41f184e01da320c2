"""ModelRunner: runs one scheduled batch of a stage through its model on the stage's device.

The model-specific part (what goes in, what comes out) is the stage's `StepModel`, written beside the
model (models/<name>/stages.py). The runner owns how the forward runs: inference mode, the paged KV
view for exactly these rows, committing the cached lengths afterwards, and timing.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from .kv_cache import BatchKV, PagedKVCache
from .scheduler import Batch, Work


class StepModel(Protocol):
    def run(self, works: list[Work], lengths: list[int], kv: BatchKV | None, prefill: bool) -> None:
        """Feed each work's next `lengths[i]` pending inputs, sample, and hand results on."""
        ...


class ModelRunner:
    def __init__(self, model: StepModel, kv: PagedKVCache | None, device: torch.device | str, name: str = "") -> None:
        self.model = model
        self.name = f"stage:{name}"
        self.kv = kv
        self.device = torch.device(device)
        self.steps = 0
        self.busy_s = 0.0

    def run(self, batch: Batch) -> None:
        start = time.perf_counter()
        with torch.inference_mode(), torch.profiler.record_function(self.name):
            view = None
            if self.kv is not None:
                view = self.kv.batch([(w.key, n) for w, n in zip(batch.works, batch.lengths, strict=True)])
            self.model.run(batch.works, batch.lengths, view, batch.prefill)
            if self.kv is not None:
                for w, n in zip(batch.works, batch.lengths, strict=True):
                    if self.kv.has(w.key):
                        self.kv.commit(w.key, n)
        self.steps += 1
        self.busy_s += time.perf_counter() - start
