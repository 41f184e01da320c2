"""Stage: one model of the pipeline with its own Scheduler and ModelRunner (and KV cache, if any)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .graphs import BUCKETS
from .kv_cache import PagedKVCache
from .model_runner import ModelRunner, StepModel
from .scheduler import Scheduler, Work


@dataclass(frozen=True)
class StageConfig:
    """Placement and capacity of one stage (`kv_blocks` 0: no KV cache)."""

    name: str
    device: str = "cpu"
    max_batch: int = 32
    max_prefill_tokens: int = 8192
    kv_blocks: int = 0
    block_size: int = 16
    graphs: bool = False  # capture fixed-shape steps as CUDA graphs (CUDA only; eager otherwise)
    graph_context: int = 8192  # tokens a decode row may hold to run the fixed-shape step (longer: eager)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_prefill_tokens < 1 or self.kv_blocks < 0 or self.block_size < 1:
            raise ValueError(f"stage {self.name}: capacities must be positive")
        if self.graph_context < 1:
            raise ValueError(f"stage {self.name}: graph_context must be positive")

    @property
    def buckets(self) -> tuple[int, ...]:
        """Batch sizes of its fixed-shape steps."""
        return tuple(b for b in BUCKETS if b < self.max_batch) + (self.max_batch,)

    @property
    def graph_blocks(self) -> int:
        return -(-self.graph_context // self.block_size)


class Stage:
    def __init__(self, cfg: StageConfig, model: StepModel, kv: PagedKVCache | None) -> None:
        self.cfg = cfg
        self.kv = kv
        self.scheduler = Scheduler(self.kv, cfg.max_batch, cfg.max_prefill_tokens)
        self.runner = ModelRunner(model, self.kv, torch.device(cfg.device), cfg.name)

    @property
    def name(self) -> str:
        return self.cfg.name

    def add(self, work: Work) -> None:
        self.scheduler.add(work)

    def remove(self, work: Work) -> None:
        self.scheduler.remove(work)

    def step(self, held: bool = False, ahead_s: float = 0.0) -> bool:
        """Run one batch of held or of committed works, if any; whether anything ran (`ahead_s`:
        Scheduler.schedule). A batch whose step raises fails its own works and the error propagates."""
        batch = self.scheduler.schedule(held, ahead_s)
        if batch is None:
            return False
        try:
            self.runner.run(batch)
        except Exception as e:
            for work in batch.works:
                work.fail("internal_error", f"{self.name}: {type(e).__name__}: {e}")
                self.remove(work)
            raise
        return True
