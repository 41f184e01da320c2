"""Fixed-shape KV views over the paged cache, block tables read on the device (CUDA-graph safe).

Row r (a sequence) writes its new tokens' K/V at `write_slots[r]` and attends over the first `seq_lens[r]` slots its
block-table row names: a decode row (one token) through the paged kernel, a prefill row causally over its table-wide
slots, gathered once per step. Every shape depends only on the bucket and the table width. Padding rows and tokens write
to a scratch slot that no sequence owns."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from .graphs import Input, Tensors
from .kv_cache import PagedKVCache, sdpa
from .paged_attention import paged_decode_attention


def prefill_inputs(tokens: int, max_blocks: int, cache: PagedKVCache) -> dict[str, Input]:
    """Per sequence (row): its `tokens` (bucket) positions and write slots, its block table and its length
    after them. Padding sequences read and write only the scratch block."""
    scratch_block = cache.scratch_slot // cache.layout.block_size
    return {"positions": Input((tokens,), torch.long, 0),
            "write_slots": Input((tokens,), torch.long, cache.scratch_slot),
            "block_table": Input((max_blocks,), torch.int32, scratch_block), "seq_lens": Input((), torch.long, 1)}


class PrefillKV:
    """Implements the KVCache protocol for the prefill of S sequences (rows) of T (bucket) tokens each:
    every row's table-wide slots gathered once per step, causal mask over them."""

    def __init__(self, cache: PagedKVCache, buffers: Tensors) -> None:
        self.k, self.v = cache.k, cache.v
        self.write_slots = buffers["write_slots"].reshape(-1)
        self.pad = self.write_slots == cache.scratch_slot  # padding tokens (KVCache.pad): no real token writes there
        bs = cache.layout.block_size
        table = buffers["block_table"].long()
        key_pos = torch.arange(table.shape[1] * bs, device=table.device)
        visible = key_pos[None, :] < buffers["seq_lens"][:, None]  # [S, W]
        slots = table[:, key_pos // bs] * bs + key_pos % bs
        self.read = torch.where(visible, slots, slots[:, :1])  # hidden keys read the row's own first slot
        self.positions = buffers["positions"]  # [S, T]
        self.mask = ((key_pos[None, None, :] <= self.positions[:, :, None]) & visible[:, None, :])[:, None]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        kc, vc = self.k[layer], self.v[layer]
        kc[self.write_slots] = k.flatten(0, 1).to(kc.dtype)
        vc[self.write_slots] = v.flatten(0, 1).to(vc.dtype)
        return sdpa(q, kc[self.read].to(q.dtype), vc[self.read].to(q.dtype), self.mask, scale)  # keys [S, W, Hkv, D]


def prefill_rows(cache: PagedKVCache, rows: list[tuple[str, int]], tokens: int, max_blocks: int) -> dict:
    """Host values of the prefill inputs: rows = [(sequence, new tokens)], each after what is cached
    (blocks reserved), padded to `tokens` (padding tokens write to the scratch slot). Array operations over all
    rows: every decode step builds these for each of its rows."""
    bs = cache.layout.block_size
    seqs = [cache.seqs[key] for key, _ in rows]
    r = len(rows)
    new = np.fromiter((n for _, n in rows), np.int64, r)
    lens = np.fromiter((s.length for s in seqs), np.int64, r)
    counts = np.fromiter((len(s.blocks) for s in seqs), np.int64, r)
    bad = (counts > max_blocks) | (new > tokens) | ((new > 0) & ((lens + new - 1) // bs >= counts))
    if bad.any():
        i = int(bad.argmax())
        raise ValueError(f"{rows[i][0]}: {new[i]} new tokens after {lens[i]} need reserved blocks within the step's "
                         f"{tokens} tokens over {max_blocks} blocks")
    table = np.zeros((r, max_blocks), dtype=np.int32)
    table[np.arange(max_blocks)[None, :] < counts[:, None]] = np.fromiter(
        itertools.chain.from_iterable(s.blocks for s in seqs), np.int32, int(counts.sum()))
    pos = lens[:, None] + np.arange(tokens)
    real = np.arange(tokens)[None, :] < new[:, None]
    slots = table[np.arange(r)[:, None], np.where(real, pos // bs, 0)].astype(np.int64) * bs + pos % bs
    return {"positions": pos, "write_slots": np.where(real, slots, cache.scratch_slot), "block_table": table,
            "seq_lens": lens + new}


def decode_inputs(max_blocks: int, scratch_slot: int) -> dict[str, Input]:
    """The static inputs a decode step's KV view reads; a padding row attends over nothing."""
    return {"positions": Input((1,), torch.long, 0), "write_slots": Input((), torch.long, scratch_slot),
            "block_table": Input((max_blocks,), torch.int32, 0), "seq_lens": Input((), torch.int32, 0)}


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
    """Host values of the decode inputs: one new token of each sequence in `keys` (blocks reserved)."""
    return prefill_rows(cache, [(key, 1) for key in keys], 1, max_blocks)
