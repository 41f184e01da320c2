"""Grouped matmul of expert-sorted rows by block-scaled fp8 expert weights, for decode: y[r] = x[r] @ W_e^T for
the rows r of expert e (rows sorted by expert; `ends` [E] int32 their cumulative ends), W_e the fp8 weight
[N, K] times its 128x128 blocks' float32 scales (fp8.py's layout), accumulated in float32, y in x's dtype.

The Triton kernel streams weights: a program takes up to TILE_M rows of one expert and TILE_N output columns,
so each weight byte is read once per TILE_M rows of its expert. Its grid depends only on M and E (enough row
tiles for any split of M rows over E experts); each program finds its expert and rows from `ends` on the
device, and a tile past the last expert's rows returns at once: no host sync, CUDA graphs can capture it.
`split`: where a weight's second half (up, after gate) starts its own 128-row blocks."""

from __future__ import annotations

import torch

from . import fp8, fused

TILE_M, TILE_N, TILE_K = 16, 64, 128


def dequantize_split(w: torch.Tensor, scale: torch.Tensor, split: int | None = None) -> torch.Tensor:
    """fp8 `w` [..., N, K] in float32; rows from `split` on are scaled by blocks of their own."""
    split = w.shape[-2] if split is None else split
    head = -(-split // fp8.BLOCK[0])
    return torch.cat([fp8.dequantize(w[..., :split, :], scale[..., :head, :], fp8.BLOCK),
                      fp8.dequantize(w[..., split:, :], scale[..., head:, :], fp8.BLOCK)], -2)


def grouped_mm_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, ends: torch.Tensor,
                         split: int | None = None) -> torch.Tensor:
    """One float32 matmul per expert with rows, by its dequantized weight (syncs on `ends`)."""
    y = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            y[start:end] = (x[start:end].float() @ dequantize_split(w[e], scale[e], split).T).to(x.dtype)
        start = end
    return y


def grouped_mm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, ends: torch.Tensor,
               split: int | None = None) -> torch.Tensor:
    return (grouped_mm_triton if x.is_cuda else grouped_mm_reference)(x, w, scale, ends, split)


def experts_swiglu(xs: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor,
                   s2: torch.Tensor) -> torch.Tensor:
    """Experts' SwiGLU on rows `xs` sorted by their expert `ids`, gate and up scaled apart."""
    ends = torch.searchsorted(ids, torch.arange(w13.shape[0], device=ids.device), right=True, out_int32=True)
    return grouped_mm(fused.silu_mul(grouped_mm(xs, w13, s13, ends, w13.shape[1] // 2)), w2, s2, ends)


def grouped_mm_triton(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, ends: torch.Tensor,
                      split: int | None = None) -> torch.Tensor:
    (m, k), (e, n, _) = x.shape, w.shape
    split = n if split is None else split
    if w.shape[2] != k or scale.shape != (e, -(-split // 128) + -(-(n - split) // 128), -(-k // 128)):
        raise ValueError(f"x {tuple(x.shape)}, w {tuple(w.shape)}, scale {tuple(scale.shape)} do not match")
    from . import fp8_moe_kernel as K  # Triton only on this path (a test may set TRITON_INTERPRET first)

    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tiles = (m + (TILE_M - 1) * min(e, m)) // TILE_M  # >= the sum over experts of ceil(rows / TILE_M)
    if tiles:
        K.grouped_kernel[(tiles, -(-n // TILE_N))](
            x.contiguous(), w.contiguous(), scale.contiguous(), ends, y, n, k, split, -(-split // 128),
            scale.shape[1], scale.shape[2], e, 1 << (e - 1).bit_length(), TILE_M, TILE_N, TILE_K)
    return y
