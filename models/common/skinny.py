"""x @ w.T for a few rows of x (decode: up to MAX_ROWS), where cuBLAS reads the weight at a fraction of the
card's bandwidth (the code predictor's 1024 x 6144 projection: 10.3 us at one row on the H200, 1.2 TB/s).
A Triton kernel streams each weight row once for all of x's rows, split over the output (and, for few outputs,
the reduction, summed in order by a second kernel: deterministic). On CUDA a graph runner's warm-up times cuBLAS
and the kernel's CONFIGS per shape and keeps the fastest (pipelines/fastest.py), so no captured step is slower
than cuBLAS; an eager step's untimed shape stays on it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipelines.fastest import fastest

from .fused import HAVE_TRITON

ENABLED = True
MAX_ROWS = 64
CONFIGS = ((32, 128, 1), (64, 128, 1), (32, 128, 4))  # (BLOCK_N, BLOCK_K, SPLIT); (16, 256, 1) never won by 0.1 us


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through the kernel where it is the faster."""
    if bias is not None or not usable(x, weight):
        return F.linear(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1])
    key = ("skinny", x2.shape[0], tuple(weight.shape), x.dtype, x.device)
    way = fastest(key, lambda: [lambda: F.linear(x2, weight)]
                  + [lambda c=c: skinny_mm(x2, weight, *c) for c in CONFIGS])
    y = F.linear(x2, weight) if way == 0 else skinny_mm(x2, weight, *CONFIGS[way - 1])
    return y.view(*x.shape[:-1], weight.shape[0])


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    rows = x.numel() // max(x.shape[-1], 1)
    return (ENABLED and HAVE_TRITON and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and 0 < rows <= MAX_ROWS and weight.stride(-1) == 1
            and x.shape[-1] % 16 == 0 and not torch.is_grad_enabled())


def skinny_mm(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_k: int, split: int) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T by the kernel (M <= MAX_ROWS)."""
    from . import skinny_kernel as K

    (m, k), n = x.shape, weight.shape[0]
    x = x if x.stride(-1) == 1 else x.contiguous()
    block_m = max(16, 1 << (m - 1).bit_length())
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    grid = (-(-n // block_n), split)
    K.skinny_mm[grid](x, weight, part, m, n, k, x.stride(0), weight.stride(0), n, m * n, BLOCK_M=block_m,
                      BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=4, num_stages=4)
    if split > 1:
        K.sum_splits[(-(-(m * n) // 1024),)](part, y, m * n, m * n, SPLIT=split, BLOCK=1024, num_warps=4)
    return y
