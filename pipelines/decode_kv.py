"""Fixed-shape KV view for a decode step: one new token per row, the block table read on the device.

Each row writes its new token's K/V at `write_slots[row]` and attends over the first `seq_lens[row]`
slots its block-table row names. Every shape depends only on the batch bucket (block-table rows have a
fixed width), so the step can be captured in a CUDA graph. Padding rows write to a scratch slot that no
sequence owns and attend over nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from .graphs import Input, Tensors
from .kv_cache import PagedKVCache
from .paged_attention import paged_decode_attention


def decode_inputs(max_blocks: int, scratch_slot: int) -> dict[str, Input]:
    """The static inputs a decode step's KV view reads (see `rows`)."""
    return {
        "positions": Input((1,), torch.long, 0),
        "write_slots": Input((), torch.long, scratch_slot),
        "block_table": Input((max_blocks,), torch.int32, 0),
        "seq_lens": Input((), torch.int32, 0),
    }


class DecodeKV:
    """Implements the models' KVCache protocol over static buffers for T = 1."""

    def __init__(self, cache: PagedKVCache, buffers: Tensors) -> None:
        self.k, self.v, self.block_size = cache.k, cache.v, cache.layout.block_size
        self.positions = buffers["positions"]
        self.write_slots = buffers["write_slots"]
        self.block_table = buffers["block_table"]
        self.seq_lens = buffers["seq_lens"]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        kc, vc = self.k[layer], self.v[layer]
        kc[self.write_slots] = k[:, 0].to(kc.dtype)
        vc[self.write_slots] = v[:, 0].to(vc.dtype)
        out = paged_decode_attention(q[:, 0], kc, vc, self.block_table, self.seq_lens, scale, self.block_size)
        return out[:, None].to(q.dtype)


def rows(cache: PagedKVCache, keys: list[str], max_blocks: int) -> dict[str, np.ndarray]:
    """Host values of the decode inputs for sequences `keys`, each getting one new token after what is
    cached (blocks already reserved)."""
    bs = cache.layout.block_size
    n = len(keys)
    table = np.zeros((n, max_blocks), dtype=np.int32)
    past = np.zeros(n, dtype=np.int64)
    slots = np.zeros(n, dtype=np.int64)
    for i, key in enumerate(keys):
        seq = cache.seqs[key]
        blocks = seq.blocks
        if len(blocks) > max_blocks:
            raise ValueError(f"{key}: {len(blocks)} blocks exceed the decode step's {max_blocks}")
        table[i, : len(blocks)] = blocks
        past[i] = seq.length
        slots[i] = blocks[seq.length // bs] * bs + seq.length % bs
    return {"positions": past[:, None], "write_slots": slots, "block_table": table,
            "seq_lens": (past + 1).astype(np.int32)}
