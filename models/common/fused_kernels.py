"""fused.py's Triton kernels, imported only on the Triton path (a test may set TRITON_INTERPRET first)."""

import triton
import triton.language as tl
from triton.language.extra import libdevice

if triton.knobs.runtime.interpret:  # the interpreter runs no libdevice; there tl.exp is numpy's exp

    @triton.jit
    def _expf(x):
        return tl.exp(x)

else:

    @triton.jit
    def _expf(x):
        """CUDA's expf, as in torch's softmax (tl.exp: ex2.approx of a rounded x * log2(e), off more as |x| grows)."""
        return libdevice.exp(x)


@triton.jit
def _normed(x, w, inv_n, eps):
    """weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), rounded as eager rounds."""
    xf = x.to(tl.float32)
    y = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) * inv_n + eps)).to(x.dtype)
    return (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype)

@triton.jit
def _norm_rows(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, n, sx, sr, so, ss, eps, inv_n,
               HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + row * sr + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * ss + cols, x, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * so + cols, _normed(x, w, inv_n, eps), mask=mask)

@triton.jit
def _rounded_mul(a, b):
    """a * b rounded to a's dtype, returned in float32."""
    return (a.to(tl.float32) * b.to(tl.float32)).to(a.dtype).to(tl.float32)

@triton.jit
def _norm_rope_head(src, dst, w_ptr, cos, sin, eps, inv_d, NORM: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    m = i < HALF
    x1 = tl.load(src + i, mask=m, other=0.0)
    x2 = tl.load(src + HALF + i, mask=m, other=0.0)
    dt = x1.dtype
    if NORM:
        a, b = x1.to(tl.float32), x2.to(tl.float32)
        inv = tl.rsqrt((tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) * inv_d + eps)
        w1 = tl.load(w_ptr + i, mask=m, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + i, mask=m, other=0.0).to(tl.float32)
        x1 = (w1 * (a * inv).to(dt).to(tl.float32)).to(dt)
        x2 = (w2 * (b * inv).to(dt).to(tl.float32)).to(dt)
    c1, c2 = tl.load(cos + i, mask=m, other=0.0), tl.load(cos + HALF + i, mask=m, other=0.0)
    s1, s2 = tl.load(sin + i, mask=m, other=0.0), tl.load(sin + HALF + i, mask=m, other=0.0)
    tl.store(dst + i, (_rounded_mul(x1, c1) - _rounded_mul(x2, s1)).to(dt), mask=m)
    tl.store(dst + HALF + i, (_rounded_mul(x2, c2) + _rounded_mul(x1, s2)).to(dt), mask=m)

@triton.jit
def _qk_norm_rope(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, T, HQ, sqb, sqt, sqh, skb, skt, skh,
                  scb, sct, ssb, sst, eps, inv_d, NORM: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # b * T + t
    h = tl.program_id(1)
    bi, ti = row // T, row % T
    cos, sin = cos_ptr + bi * scb + ti * sct, sin_ptr + bi * ssb + ti * sst
    nh = tl.num_programs(1)
    if h < HQ:
        _norm_rope_head(q_ptr + bi * sqb + ti * sqt + h * sqh, qo_ptr + (row * HQ + h) * 2 * HALF, qw_ptr,
                        cos, sin, eps, inv_d, NORM, HALF, BLOCK)
    else:
        _norm_rope_head(k_ptr + bi * skb + ti * skt + (h - HQ) * skh, ko_ptr + (row * (nh - HQ) + h - HQ) * 2 * HALF,
                        kw_ptr, cos, sin, eps, inv_d, NORM, HALF, BLOCK)

@triton.jit
def _snake(x_ptr, alpha_ptr, beta_ptr, out_ptr, n, t, c, BLOCK: tl.constexpr):
    """SnakeBeta on a contiguous [B, C, T]: x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2 per channel, each
    operation rounded to x's dtype as eager's separate kernels round."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    dt = x.dtype
    ch = (i // t) % c
    a = tl.exp(tl.load(alpha_ptr + ch, mask=m, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
    b = tl.exp(tl.load(beta_ptr + ch, mask=m, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
    inv = (1.0 / (b + 1e-9).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    s = tl.sin((x.to(tl.float32) * a).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    s = (s * s).to(dt).to(tl.float32)
    tl.store(out_ptr + i, (x.to(tl.float32) + (inv * s).to(dt).to(tl.float32)).to(dt), mask=m)

@triton.jit
def _route(logits_ptr, w_ptr, idx_ptr, n_experts, stride, TOP_K: tl.constexpr, NORM: tl.constexpr,
           BLOCK: tl.constexpr, K_BLOCK: tl.constexpr):
    """One token's row: softmax over the experts in float32, exp(x - max) / sum as torch computes it; then TOP_K
    rounds of taking the largest probability, the lowest expert index among equal ones; the TOP_K weights
    divided by their sum when NORM. A NaN probability ranks first, as in torch's topk, so ids stay in range."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < n_experts
    x = tl.load(logits_ptr + row * stride + cols, mask=live, other=float("-inf")).to(tl.float32)
    e = _expf(x - tl.max(x, axis=0))
    p = tl.math.div_rn(e, tl.sum(e, axis=0))
    key = tl.where(live, tl.where(p == p, p, float("inf")), float("-inf"))  # taken lanes become -inf too
    ks = tl.arange(0, K_BLOCK)
    w = tl.zeros([K_BLOCK], dtype=tl.float32)
    idx = tl.zeros([K_BLOCK], dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(key, axis=0)
        at = tl.min(tl.where(key == best, cols, BLOCK), axis=0)
        w = tl.where(ks == k, best, w)
        idx = tl.where(ks == k, at, idx)
        key = tl.where(cols == at, float("-inf"), key)
    w = tl.where(w == float("inf"), float("nan"), w)
    if NORM:
        w = tl.math.div_rn(w, tl.sum(w, axis=0))
    tl.store(w_ptr + row * TOP_K + ks, w, mask=ks < TOP_K)
    tl.store(idx_ptr + row * TOP_K + ks, idx.to(tl.int64), mask=ks < TOP_K)


@triton.jit
def _silu_mul(x_ptr, out_ptr, half, stride, BLOCK: tl.constexpr):
    """One row's block of silu(gate) * up, as eager: x / (1 + expf(-x)) in float32 rounded, then the product."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = i < half
    g = tl.load(x_ptr + row * stride + i, mask=m, other=0.0)
    u = tl.load(x_ptr + row * stride + half + i, mask=m, other=0.0)
    gf = g.to(tl.float32)
    s = tl.math.div_rn(gf, 1.0 + _expf(-gf)).to(g.dtype)
    tl.store(out_ptr + row * half + i, (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=m)


@triton.jit
def _frame_attention(q_ptr, k_ptr, v_ptr, kb_ptr, vb_ptr, o_ptr, past, t_new, sq_b, sq_t, sk_b, sk_t, sv_b, sv_t,
                     sb_b, sb_p, so_b, so_t, scale,
                     GROUP: tl.constexpr, D: tl.constexpr, P: tl.constexpr, TQ: tl.constexpr):
    """One row's kv head g: its t_new new keys and values go to the buffers at past.. (kb, vb [B, P, Hkv, D]);
    each of its GROUP query heads' t_new queries attends causally over the past + t_new positions, the new
    ones taken from registers (no store-then-load ordering needed), softmax in float32."""
    b, g = tl.program_id(0).to(tl.int64), tl.program_id(1)
    pos = tl.arange(0, P)
    d = tl.arange(0, D)
    new = (pos >= past) & (pos < past + t_new)
    old = pos < past
    k_new = b * sk_b + (pos - past)[:, None] * sk_t + g * D + d[None, :]
    v_new = b * sv_b + (pos - past)[:, None] * sv_t + g * D + d[None, :]
    in_buf = b * sb_b + pos[:, None] * sb_p + g * D + d[None, :]
    keys = tl.where(new[:, None], tl.load(k_ptr + k_new, mask=new[:, None], other=0.0),
                    tl.load(kb_ptr + in_buf, mask=old[:, None], other=0.0))
    vals = tl.where(new[:, None], tl.load(v_ptr + v_new, mask=new[:, None], other=0.0),
                    tl.load(vb_ptr + in_buf, mask=old[:, None], other=0.0))
    tl.store(kb_ptr + in_buf, keys, mask=new[:, None])
    tl.store(vb_ptr + in_buf, vals, mask=new[:, None])
    kf, vf = keys.to(tl.float32), vals.to(tl.float32)
    for t in tl.static_range(TQ):
        if t < t_new:
            seen = pos <= past + t
            for h in tl.static_range(GROUP):
                head = g * GROUP + h
                q = tl.load(q_ptr + b * sq_b + t * sq_t + head * D + d).to(tl.float32)
                s = tl.where(seen, tl.sum(kf * q[None, :], axis=1) * scale, float("-inf"))
                p = tl.exp(s - tl.max(s, axis=0))
                o = tl.sum(p[:, None] * vf, axis=0) / tl.sum(p, axis=0)
                tl.store(o_ptr + b * so_b + t * so_t + head * D + d, o.to(keys.dtype))


@triton.jit
def _align(ids_ptr, order_ptr, ends_ptr, n, n_experts, BLOCK: tl.constexpr, E_BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """The n expert ids' stable sort by expert in one program: keys id * BLOCK + position are unique, so a sort
    of the keys is the stable argsort (order = key % BLOCK); ends[e] = the number of ids <= e, counted CHUNK ids
    a round. Padding lanes take id n_experts: after every copy, in no expert's count."""
    i = tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + i, mask=i < n, other=n_experts).to(tl.int32)
    key = tl.sort(ids * BLOCK + i)
    tl.store(order_ptr + i, (key % BLOCK).to(tl.int64), mask=i < n)
    e = tl.arange(0, E_BLOCK)
    counts = tl.zeros([E_BLOCK], dtype=tl.int32)
    for c in range(0, n, CHUNK):
        j = c + tl.arange(0, CHUNK)
        chunk = tl.load(ids_ptr + j, mask=j < n, other=n_experts).to(tl.int32)
        counts += tl.sum((chunk[None, :] <= e[:, None]).to(tl.int32), axis=1)
    tl.store(ends_ptr + e, counts, mask=e < n_experts)
