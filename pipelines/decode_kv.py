"""Fixed-shape KV views over the paged cache, block tables read on the device (CUDA-graph safe).

Decode (`DecodeKV`): one new token per row; row r writes its token's K/V at `write_slots[r]` and
attends over the first `seq_lens[r]` slots its block-table row names, through the paged kernel.
Prefill (`PrefillKV`): the bucket's tokens of ONE sequence; token i writes at `write_slots[i]` and
attends causally over the sequence's table-wide slots, gathered once per step. Every shape depends
only on the bucket and the table width. Padding rows and tokens write to a scratch slot that no
sequence owns; a padding decode row attends over nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from .graphs import Input, Tensors
from .kv_cache import PagedKVCache
from .paged_attention import paged_decode_attention


def prefill_inputs(max_blocks: int, scratch_slot: int) -> dict[str, Input]:
    """Per token: position and write slot; per call: the sequence's block table and length after it."""
    return {
        "positions": Input((), torch.long, 0),
        "write_slots": Input((), torch.long, scratch_slot),
        "block_table": Input((max_blocks,), torch.int32, 0, rows=False),
        "seq_len": Input((), torch.long, 1, rows=False),
    }


class PrefillKV:
    """Implements the KVCache protocol for one sequence's prefill of T (bucket) tokens, batch 1."""

    def __init__(self, cache: PagedKVCache, buffers: Tensors) -> None:
        self.k, self.v = cache.k, cache.v
        self.write_slots = buffers["write_slots"]
        bs = cache.layout.block_size
        key_pos = torch.arange(buffers["block_table"].shape[0] * bs, device=self.write_slots.device)
        visible = key_pos < buffers["seq_len"]
        slots = buffers["block_table"].long()[key_pos // bs] * bs + key_pos % bs
        self.read = torch.where(visible, slots, slots[0])  # hidden keys read the sequence's own first slot
        self.positions = buffers["positions"][None]  # [1, T]
        self.mask = ((key_pos[None, :] <= buffers["positions"][:, None]) & visible)[None, None]  # [1, 1, T, W]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        kc, vc = self.k[layer], self.v[layer]
        kc[self.write_slots] = k[0].to(kc.dtype)
        vc[self.write_slots] = v[0].to(vc.dtype)
        keys, values = kc[self.read][None].to(q.dtype), vc[self.read][None].to(q.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=self.mask, scale=scale,
            enable_gqa=q.shape[2] != keys.shape[2],
        )
        return out.transpose(1, 2)


def prefill_rows(cache: PagedKVCache, key: str, n: int, max_blocks: int) -> dict[str, np.ndarray]:
    """Host values of the prefill inputs for n new tokens of `key` after what is cached (blocks reserved)."""
    bs = cache.layout.block_size
    seq = cache.seqs[key]
    if len(seq.blocks) > max_blocks:
        raise ValueError(f"{key}: {len(seq.blocks)} blocks exceed the prefill step's {max_blocks}")
    pos = np.arange(seq.length, seq.length + n)
    blocks = np.asarray(seq.blocks, dtype=np.int64)
    table = np.zeros(max_blocks, dtype=np.int32)
    table[: len(blocks)] = blocks
    return {"positions": pos, "write_slots": blocks[pos // bs] * bs + pos % bs, "block_table": table,
            "seq_len": np.asarray(seq.length + n)}


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
