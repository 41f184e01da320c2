"""A stage's prefill: one forward function, run at `PrefillGraphs`' fixed shapes where sequences fit its buckets, else
in one eager call built for the longest row's tokens and the widest row's block table."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from pipelines import kv_views
from pipelines.graphs import GraphRunner, Input, PrefillGraphs, Tensors
from pipelines.kv_cache import PagedKVCache


def pad_rows(rows: list[torch.Tensor], length: int) -> torch.Tensor:
    """[n_i, H] rows -> [B, length, H], zero padded."""
    out = rows[0].new_zeros(len(rows), length, rows[0].shape[1])
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


class InputRows(Protocol):
    def tail(self, start: int) -> torch.Tensor:
        """A sequence's input embeddings from position `start` on [N - start, H]."""


@dataclass(frozen=True)
class PrefillCall:
    """One call of the prefill step: its rows (work, new tokens), the runner, and the shape it runs at."""

    group: list[tuple[Any, int]]
    runner: GraphRunner
    tokens: int  # new tokens per row, padded
    blocks: int  # block-table width per row


@dataclass
class Prefills:
    name: str
    step: Callable[[Tensors], Tensors]
    inputs: Callable[[int, int], dict[str, Input]]  # (tokens, table blocks) -> the step's inputs
    kv: PagedKVCache
    device: torch.device
    graphs: bool
    fixed: PrefillGraphs = field(init=False)

    def __post_init__(self) -> None:
        self.fixed = PrefillGraphs(self.name, self.step, self.inputs, self.kv.layout.block_size, self.device,
                                   self.graphs)

    def capture(self, pool: object | None) -> object | None:
        return self.fixed.capture(pool)

    def calls(self, works: list, lengths: list[int]) -> Iterator[PrefillCall]:
        """The calls that prefill `lengths[i]` new tokens of each `works[i].key` (blocks reserved)."""
        bs = self.kv.layout.block_size
        shapes = [self.fixed.shape(n, self.kv.length(w.key) + n) for w, n in zip(works, lengths, strict=True)]
        fits = [((w, n), s) for w, n, s in zip(works, lengths, shapes, strict=True) if s]
        for (t, c), group in self.fixed.groups(fits):
            yield PrefillCall(group, self.fixed.runners[t, c], t, c // bs)
        rest = [(w, n) for w, n, s in zip(works, lengths, shapes, strict=True) if s is None]
        if rest:
            tokens = max(n for _, n in rest)
            blocks = max(len(self.kv.seqs[w.key].blocks) for w, _ in rest)
            runner = GraphRunner(f"{self.name}[eager]", self.step, self.inputs(tokens, blocks), self.device,
                                 (len(rest),), graphs=False)
            yield PrefillCall(rest, runner, tokens, blocks)

    def rows(self, call: PrefillCall, inputs: Callable[[Any], InputRows]) -> dict:
        """The call's KV rows, each row's `last` new token and `x`: its uncached inputs, padded."""
        group = call.group
        rows = kv_views.prefill_rows(self.kv, [(w.key, n) for w, n in group], call.tokens, call.blocks)
        x = pad_rows([inputs(w).tail(self.kv.length(w.key))[:n] for w, n in group], call.tokens)
        return rows | {"x": x, "last": [n - 1 for _, n in group]}


def prefill_step_inputs(hidden: int, dtype: torch.dtype, tokens: int, blocks: int,
                        cache: PagedKVCache) -> dict[str, Input]:
    """A prefill step's inputs per sequence (row): its new tokens and what it samples from its last one."""
    return {"x": Input((tokens, hidden), dtype, on_device=True), **kv_views.prefill_inputs(tokens, blocks, cache),
            "last": Input((), torch.long, 0), "no_eos": Input((), torch.bool, False)}


def last_hidden(hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """[S, T, H] -> [S, H]: each row's hidden state at its last real token (`last` [S])."""
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
