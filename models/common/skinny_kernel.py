"""skinny.py's Triton kernels, imported only on its path (a test may set TRITON_INTERPRET first)."""

import triton
import triton.language as tl


@triton.jit
def skinny_mm(x_ptr, w_ptr, y_ptr, m, n, k, sxm, swn, sym, sys,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    """y[s] = x @ w.T over the k-slices s, s + SPLIT, ... of BLOCK_K: a program streams BLOCK_N rows of w once
    for all of x's (at most BLOCK_M) rows. With SPLIT > 1, y is float32 partials [SPLIT, m, n]."""
    pid_n, pid_s = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, k, BLOCK_K * SPLIT):
        kk = k0 + pid_s * BLOCK_K + rk
        xt = tl.load(x_ptr + rm[:, None] * sxm + kk[None, :], mask=(rm[:, None] < m) & (kk[None, :] < k), other=0.0)
        wt = tl.load(w_ptr + rn[:, None] * swn + kk[None, :], mask=(rn[:, None] < n) & (kk[None, :] < k), other=0.0)
        acc += tl.dot(xt, tl.trans(wt))
    out = y_ptr + pid_s * sys + rm[:, None] * sym + rn[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < m) & (rn[None, :] < n))


@triton.jit
def sum_splits(p_ptr, y_ptr, total, sps, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """y = the sum of the SPLIT partials, in order, cast to y's dtype."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < total
    acc = tl.load(p_ptr + i, mask=inside, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(p_ptr + s * sps + i, mask=inside, other=0.0)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=inside)
