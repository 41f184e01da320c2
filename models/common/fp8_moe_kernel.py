"""fp8_moe.py's Triton kernel, imported only on the Triton path."""

import triton
import triton.language as tl


@triton.jit
def grouped_kernel(x_ptr, w_ptr, s_ptr, ends_ptr, y_ptr, order_ptr, wt_ptr, top_k, n, k, split, split_blocks, s_rows,
                   s_cols, E: tl.constexpr, E2: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GATHER: tl.constexpr, SCATTER: tl.constexpr, LOW: tl.constexpr):
    """GATHER: sorted row r reads x's row order[r] // top_k; SCATTER: it is written to y's row order[r], times the
    routing weight wt[order[r]] (rounded as eager's multiply)."""
    tile = tl.program_id(0)
    experts = tl.arange(0, E2)
    ends = tl.load(ends_ptr + experts, mask=experts < E, other=0)
    starts = tl.load(ends_ptr + experts - 1, mask=(experts > 0) & (experts < E), other=0)
    tiles = tl.where(experts < E, (ends - starts + BM - 1) // BM, 0)
    tile_ends = tl.cumsum(tiles, 0)
    e = tl.sum((tile_ends <= tile).to(tl.int32), 0)
    if e >= E:
        return
    mine = experts == e
    first = tl.sum(tl.where(mine, starts, 0), 0) + (tile - tl.sum(tl.where(mine, tile_ends - tiles, 0), 0)) * BM
    rows = first + tl.arange(0, BM)
    row_ok = rows < tl.sum(tl.where(mine, ends, 0), 0)
    copy = tl.load(order_ptr + rows, mask=row_ok, other=0) if GATHER or SCATTER else rows
    src = copy // top_k if GATHER else rows
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    col_ok = cols < n
    block_rows = tl.where(cols < split, cols // 128, split_blocks + (cols - split) // 128)
    w_rows = w_ptr + e.to(tl.int64) * n * k + cols[:, None] * k
    s_rows_ptr = s_ptr + (e.to(tl.int64) * s_rows + block_rows) * s_cols
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, k, BK):
        ks = k0 + tl.arange(0, BK)
        xt = tl.load(x_ptr + src[:, None] * k + ks[None, :], mask=row_ok[:, None] & (ks[None, :] < k), other=0.0)
        wt = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & (ks[None, :] < k), other=0.0,
                     eviction_policy="evict_first")
        s = tl.load(s_rows_ptr + k0 // 128, mask=col_ok, other=0.0)
        if LOW:  # x's 16-bit dtype holds the fp8 values exactly; the products are exact in float32
            acc += tl.dot(xt, tl.trans(wt.to(xt.dtype))) * s[None, :]
        else:  # bf16 and fp8 values are exact in tf32 (and the interpreter's bf16 dot is wrong)
            acc += tl.dot(xt.to(tl.float32), tl.trans(wt.to(tl.float32))) * s[None, :]
    y = acc.to(y_ptr.dtype.element_ty)
    dst = rows
    if SCATTER:
        dst = copy
        wt = tl.load(wt_ptr + copy, mask=row_ok, other=0.0).to(tl.float32)
        y = (y.to(tl.float32) * wt[:, None]).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + dst[:, None] * n + cols[None, :], y, mask=row_ok[:, None] & col_ok[None, :])
