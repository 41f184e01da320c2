"""Placeholder (replaced by the kernel branch): paged decode attention, plain torch."""

from __future__ import annotations

import torch


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale, block_size):  # noqa: ANN001, ANN201
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    width = block_table.shape[1] * block_size
    pos = torch.arange(width, device=q.device)
    slots = block_table.long()[:, pos // block_size] * block_size + pos % block_size
    keys, values = k_cache[slots].float(), v_cache[slots].float()  # [B, L, Hkv, D]
    qf = q.float().view(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,blhd->bhgl", qf, keys) * scale
    visible = pos[None, :] < seq_lens[:, None]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.nan_to_num(scores.softmax(-1))
    return torch.einsum("bhgl,blhd->bhgd", probs, values).reshape(b, hq, d).to(q.dtype)
