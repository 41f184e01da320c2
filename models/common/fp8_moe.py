"""Grouped matmul of expert-sorted rows by block-scaled fp8 expert weights, for decode: y[r] = x[r] @ W_e^T for
the rows r of expert e (rows sorted by expert; `ends` [E] int32 their cumulative ends), W_e the fp8 weight
[N, K] times its 128x128 blocks' float32 scales (fp8.py's layout), accumulated in float32, y in x's dtype.

The Triton kernel streams weights: a program takes up to TILE_M rows of one expert and TILE_N output columns,
so each weight byte is read once per TILE_M rows of its expert. Its grid depends only on M and E (enough row
tiles for any split of M rows over E experts); each program finds its expert and rows from `ends` on the
device, and a tile past the last expert's rows returns at once: no host sync, CUDA graphs can capture it.
`split`: where a weight's second half (up, after gate) starts its own 128-row blocks. From PREFILL_ROWS rows on
(a prefill's dozens of rows an expert) wider tiles re-read each weight less, and a CUDA tile's dot takes x's 16-bit
dtype, which holds the fp8 values exactly (float32: half the tensor-core rate; Triton's interpreter has no bf16 dot)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import fp8, fused

TILE_M, TILE_N, TILE_K = 16, 64, 128
# (TILE_M, TILE_N, TILE_K, warps, pipeline stages) from PREFILL_ROWS rows a call (None: never). One thinker layer on
# the H200: 0.67 -> 0.38 ms at 768 tokens, 0.38 -> 0.36 at 384 (3,072 rows); at 192 tokens the decode's tiles are
# faster; no other tiling, stage count or W x^T order was faster at 768 or 1,536 tokens (RESULTS.md)
PREFILL, PREFILL_ROWS = (64, 128, 128, 4, 3), 3072
DISPATCH = True  # the gather and scatter inside the grouped kernels (False: torch ops around them)


def dequantize_split(w: torch.Tensor, scale: torch.Tensor, split: int | None = None) -> torch.Tensor:
    """fp8 `w` [..., N, K] in float32; rows from `split` on are scaled by blocks of their own."""
    split = w.shape[-2] if split is None else split
    head = -(-split // fp8.BLOCK[0])
    return torch.cat([fp8.dequantize(w[..., :split, :], scale[..., :head, :], fp8.BLOCK),
                      fp8.dequantize(w[..., split:, :], scale[..., head:, :], fp8.BLOCK)], -2)


@dataclass(frozen=True)
class Dispatch:
    """Token copies sorted by expert: sorted row r is copy order[r] of the [N * top_k] copies, of token
    order[r] // top_k; `weights` [N * top_k] their routing weights, in copy order."""

    order: torch.Tensor
    top_k: int
    weights: torch.Tensor

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens [N, H] -> their copies' rows in sorted order [N * top_k, H]."""
        return x[self.order // self.top_k]

    def place(self, y: torch.Tensor) -> torch.Tensor:
        """Sorted rows' outputs -> in copy order, each times its weight (a permutation: deterministic)."""
        out = torch.empty_like(y)
        out[self.order] = y * self.weights[self.order, None].to(y.dtype)
        return out


def grouped_mm_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, ends: torch.Tensor,
                         split: int | None = None, gather: Dispatch | None = None,
                         scatter: Dispatch | None = None) -> torch.Tensor:
    """One float32 matmul per expert with rows, by its dequantized weight (syncs on `ends`); with `gather` the
    sorted rows are read from x's tokens, with `scatter` written to their copies' places, times their weights."""
    xs = x if gather is None else gather.rows(x)
    y = torch.zeros(xs.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            y[start:end] = (xs[start:end].float() @ dequantize_split(w[e], scale[e], split).T).to(x.dtype)
        start = end
    return y if scatter is None else scatter.place(y)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, ends: torch.Tensor, split: int | None = None,
               gather: Dispatch | None = None, scatter: Dispatch | None = None) -> torch.Tensor:
    return (grouped_mm_triton if x.is_cuda else grouped_mm_reference)(x, w, scale, ends, split, gather, scatter)


def experts_swiglu(x: torch.Tensor, ends: torch.Tensor, dispatch: Dispatch, w13: torch.Tensor, s13: torch.Tensor,
                   w2: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """Experts' SwiGLU of tokens x [N, H] for their copies in `dispatch.order` (sorted by expert; `ends` [E] each
    expert's end there) -> [N * top_k, H], each copy's output times its weight, in copy order; gate and up scaled
    apart."""
    if not DISPATCH:
        h = fused.silu_mul(grouped_mm(dispatch.rows(x), w13, s13, ends, w13.shape[1] // 2))
        return dispatch.place(grouped_mm(h, w2, s2, ends))
    h = fused.silu_mul(grouped_mm(x, w13, s13, ends, w13.shape[1] // 2, gather=dispatch))
    return grouped_mm(h, w2, s2, ends, scatter=dispatch)


def grouped_mm_triton(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, ends: torch.Tensor,
                      split: int | None = None, gather: Dispatch | None = None,
                      scatter: Dispatch | None = None) -> torch.Tensor:
    (rows, k), (e, n, _) = x.shape, w.shape
    split = n if split is None else split
    if w.shape[2] != k or scale.shape != (e, -(-split // 128) + -(-(n - split) // 128), -(-k // 128)):
        raise ValueError(f"x {tuple(x.shape)}, w {tuple(w.shape)}, scale {tuple(scale.shape)} do not match")
    if gather is not None and scatter is not None:
        raise ValueError("grouped_mm: a gather or a scatter, not both")
    from . import fp8_moe_kernel as K  # Triton only on this path (a test may set TRITON_INTERPRET first)

    dispatch = gather or scatter
    m = rows if gather is None else gather.order.numel()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    wide = PREFILL is not None and m >= PREFILL_ROWS
    bm, bn, bk, warps, stages = PREFILL if wide else (TILE_M, TILE_N, TILE_K, 4, 3)
    tiles = (m + (bm - 1) * min(e, m)) // bm  # >= the sum over experts of ceil(rows / bm)
    if tiles:
        order = y if dispatch is None else dispatch.order
        weights = y if scatter is None else scatter.weights
        K.grouped_kernel[(tiles, -(-n // bn))](
            x.contiguous(), w.contiguous(), scale.contiguous(), ends, y, order, weights,
            1 if dispatch is None else dispatch.top_k, n, k, split, -(-split // 128), scale.shape[1], scale.shape[2],
            e, 1 << (e - 1).bit_length(), bm, bn, bk, GATHER=gather is not None, SCATTER=scatter is not None,
            LOW=wide and x.is_cuda and x.dtype != torch.float32, num_warps=warps, num_stages=stages)
    return y
