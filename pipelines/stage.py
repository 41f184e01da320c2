"""Stage: one model of the pipeline with its own Scheduler and ModelRunner (and KV cache, if any)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .graphs import BUCKETS
from .kv_cache import PagedKVCache
from .model_runner import ModelRunner, StepModel
from .scheduler import URGENT_S, Batch, Scheduler, Work


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
    overlap: bool = False  # its decode runs beside the later stages of the round, which see its results next round
    decode_after_prefill: bool = False  # a launch that prefills new turns then decodes the streams (they keep a round)

    @property
    def urgent_s(self) -> float:
        """Its scheduler's prefill gate: none when a prefill no longer takes the streams' round."""
        return 0.0 if self.decode_after_prefill else URGENT_S

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
    """On CUDA a stage runs on a stream of its own, its graphs captured there in a pool of their own, so that an
    overlapping stage's step runs on the GPU beside the next stages' (what they share is what a host sync made)."""

    def __init__(self, cfg: StageConfig, model: StepModel, kv: PagedKVCache | None) -> None:
        self.cfg = cfg
        self.kv = kv
        self.scheduler = Scheduler(self.kv, cfg.max_batch, cfg.max_prefill_tokens)
        self.scheduler.urgent_s = cfg.urgent_s
        self.runner = ModelRunner(model, self.kv, torch.device(cfg.device), cfg.name)
        self.stream = torch.cuda.Stream(self.runner.device) if self.runner.device.type == "cuda" else None
        self._unfinished: tuple[Callable[[], None], Batch] | None = None

    @contextlib.contextmanager
    def on_stream(self) -> Iterator[None]:
        """The stage's stream as the current one, after all work queued on the default stream (other threads'
        and the engine's own between steps)."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.default_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            yield

    def capture(self) -> None:
        with self.on_stream():
            self.runner.capture(None)

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
        ran = self.launch(held, ahead_s)
        self.finish()
        return ran

    def launch(self, held: bool = False, ahead_s: float = 0.0) -> bool:
        """`step`, but an overlapping stage's decode is left running until `finish`. Its results reach the next
        stages a round late, so it runs ahead of their playback (`ahead_s` does not hold it back). With
        `decode_after_prefill` a prefill costs the playing streams its own time, not their turn in this round."""
        ahead_s = 0.0 if self.cfg.overlap else ahead_s
        with self.on_stream():  # what the works compute as they are scheduled runs on the stage's stream too
            batch = self.scheduler.schedule(held, ahead_s)
            if batch is None:
                return False
            with self._failing(batch):
                finish = self.runner.run(batch)
            if batch.prefill and self.cfg.decode_after_prefill:
                decode = self.scheduler.schedule(held, ahead_s, prefills=False)
                if decode is not None:
                    batch = decode
                    with self._failing(batch):
                        finish = self.runner.run(batch)
        if finish is not None:
            self._unfinished = (finish, batch)
            if not self.cfg.overlap:
                self.finish()
        return True

    def finish(self) -> None:
        """Read back the results of a decode left running and hand them on."""
        if self._unfinished is None:
            return
        finish, batch = self._unfinished
        self._unfinished = None
        with self._failing(batch), self.on_stream():
            finish()

    @contextlib.contextmanager
    def _failing(self, batch: Batch) -> Iterator[None]:
        try:
            yield
        except Exception as e:
            for work in batch.works:
                work.fail("internal_error", f"{self.name}: {type(e).__name__}: {e}")
                self.remove(work)
            raise
