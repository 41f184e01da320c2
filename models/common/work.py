"""What every stage's work item shares: the turn it serves (what the runtime reads of it: `Turn`) and its cache key."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from pipelines.sampling import SamplingParams
from pipelines.types import GenerationOptions

GREEDY = SamplingParams(greedy=True)
NAN_MESSAGE = "the model's output is not a number"  # a row whose logits hold a NaN: its turn ends alone


def settle(sampling: dict[str, SamplingParams], opts: GenerationOptions) -> dict[str, SamplingParams]:
    """Each stage's sampling under `opts`: greedy is argmax in every stage, the talker keeping its repetition
    penalty as the references' greedy does; the request's seed for a stage without one."""
    if opts.greedy:
        sampling = {n: SamplingParams(greedy=True, repetition_penalty=p.repetition_penalty) if n == "talker" else GREEDY
                    for n, p in sampling.items()}
    return {n: replace(p, seed=opts.seed) if opts.seed and not p.seed else p for n, p in sampling.items()}


class Turn(Protocol):
    held: bool

    def urgency(self) -> float: ...

    def fail(self, code: str, message: str) -> None: ...


class Work:
    keep_kv = False

    def __init__(self, turn: Turn, key: str) -> None:
        self.turn = turn
        self.key = key
        self.slot: int | None = None  # its row of the stage's per-stream state (a stream stage's), once it has one
        self.free_slot: Callable[[int], None] = lambda slot: None

    @property
    def held(self) -> bool:
        return self.turn.held

    def urgency(self) -> float:
        return self.turn.urgency()

    def fail(self, code: str, message: str) -> None:
        self.turn.fail(code, message)

    def release(self) -> None:
        """Give back what the work holds beyond its KV cache (called once its turn has ended)."""
        if self.slot is not None:
            self.free_slot(self.slot)
            self.slot = None
