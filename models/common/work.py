"""What every stage's work item shares: the turn it serves (the part the runtime reads: `Turn`) and the key
of its cache entries."""

from __future__ import annotations

from typing import Protocol

from pipelines.sampling import SamplingParams

GREEDY = SamplingParams(greedy=True)
NAN_MESSAGE = "the model's output is not a number"  # a row whose logits hold a NaN: its turn ends alone


class Turn(Protocol):
    held: bool

    def urgency(self) -> float: ...

    def fail(self, code: str, message: str) -> None: ...


class Work:
    keep_kv = False

    def __init__(self, turn: Turn, key: str) -> None:
        self.turn = turn
        self.key = key

    @property
    def held(self) -> bool:
        return self.turn.held

    def urgency(self) -> float:
        return self.turn.urgency()

    def fail(self, code: str, message: str) -> None:
        self.turn.fail(code, message)

    def release(self) -> None:
        """Give back what the work holds beyond its KV cache (called once its turn has ended)."""
