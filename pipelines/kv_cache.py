"""Paged KV cache: fixed-size blocks in one preallocated pool per layer, a block table per sequence.

A sequence (a session's conversation, or a stream of a later stage) owns a list of blocks; its token i lives in slot
`blocks[i // block_size] * block_size + i % block_size`. Its batch views (kv_views.py's fixed-shape ones) implement
models.common.layers.KVCache."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Attention in the [B, T, H, D] layout: q [B, T, Hq, D] over k, v [B, L, Hkv, D] (grouped heads)."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                          scale=scale, enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)


class OutOfBlocks(RuntimeError):
    pass


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("KV cache needs at least one block of at least one slot")

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


@dataclass
class SeqBlocks:
    blocks: list[int] = field(default_factory=list)
    length: int = 0  # tokens whose K/V are written


class PagedKVCache:
    def __init__(self, layout: KVLayout) -> None:
        self.layout = layout
        # one block more than the layout's: the scratch block, owned by no sequence, where padding rows write
        self.scratch_slot = layout.num_blocks * layout.block_size
        shape = (layout.num_layers, self.scratch_slot + layout.block_size, layout.kv_heads, layout.head_dim)
        self.k = torch.zeros(shape, dtype=layout.dtype, device=layout.device)
        self.v = torch.zeros(shape, dtype=layout.dtype, device=layout.device)
        self.free: list[int] = list(range(layout.num_blocks - 1, -1, -1))
        self.seqs: OrderedDict[str, SeqBlocks] = OrderedDict()  # least recently used first

    @property
    def num_free(self) -> int:
        return len(self.free)

    def length(self, seq: str) -> int:
        s = self.seqs.get(seq)
        return 0 if s is None else s.length

    def has(self, seq: str) -> bool:
        return seq in self.seqs

    def reserve(self, seq: str, new_tokens: int) -> None:
        """Make room for `new_tokens` more tokens of `seq`; raises OutOfBlocks, allocating nothing."""
        s = self.seqs.get(seq, SeqBlocks())
        need = max(0, self.layout.blocks_for(s.length + new_tokens) - len(s.blocks))
        if need > len(self.free):
            raise OutOfBlocks(f"{seq} needs {need} blocks, {len(self.free)} free")
        self.seqs[seq] = s
        self.seqs.move_to_end(seq)
        s.blocks.extend(self.free.pop() for _ in range(need))

    def commit(self, seq: str, new_tokens: int) -> None:
        s = self.seqs[seq]
        if s.length + new_tokens > len(s.blocks) * self.layout.block_size:
            raise RuntimeError(f"{seq}: commit past reserved blocks")
        s.length += new_tokens

    def truncate(self, seq: str, length: int) -> None:
        s = self.seqs.get(seq)
        if s is None:
            return
        s.length = min(s.length, length)
        keep = self.layout.blocks_for(s.length)
        self.free.extend(reversed(s.blocks[keep:]))
        del s.blocks[keep:]

    def release(self, seq: str) -> None:
        s = self.seqs.pop(seq, None)
        if s is not None:
            self.free.extend(reversed(s.blocks))

    def lru(self, exclude: set[str]) -> list[str]:
        return [k for k in self.seqs if k not in exclude]

    def check(self) -> None:
        """Integrity: each block is either free or in exactly one table; lengths fit their blocks."""
        owned = [b for s in self.seqs.values() for b in s.blocks]
        everything = owned + self.free
        if sorted(everything) != list(range(self.layout.num_blocks)):
            raise AssertionError(f"KV block accounting broken: {len(owned)} owned + {len(self.free)} free")
        for name, s in self.seqs.items():
            if s.length > len(s.blocks) * self.layout.block_size:
                raise AssertionError(f"{name}: length {s.length} exceeds its {len(s.blocks)} blocks")

    def slots(self, seq: str, start: int, end: int) -> torch.Tensor:
        blocks = torch.tensor(self.seqs[seq].blocks, dtype=torch.long)
        pos = torch.arange(start, end)
        return blocks[pos // self.layout.block_size] * self.layout.block_size + pos % self.layout.block_size
