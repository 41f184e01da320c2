"""sampling.py's sampler as one Triton kernel, a program per row, imported only on its path (a test may set
TRITON_INTERPRET first). The row stays in registers; top-k's and top-p's cut-offs are found by a binary
search over the logits' order-preserving 32-bit keys (32 masked counts or sums each), not by a sort."""

import triton
import triton.language as tl


@triton.jit
def _ordered_key(x):
    """float32 -> uint32 with the floats' order (-inf lowest, NaNs at the ends)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) == 0, bits | 0x80000000, bits ^ 0xFFFFFFFF)


@triton.jit
def _gumbel(seed, step, idx):
    """sampling.uniform's counter hash, in uint32 (its int64 masked to 32 bits is the same ring), to Gumbel."""
    x = seed.to(tl.uint32) * 0x9E3779B1 + step.to(tl.uint32) * 0x7FEB352D + idx.to(tl.uint32) * 0x2C1B3C6D
    for _ in tl.static_range(3):
        x = (x ^ (x >> 16)) * 0x45D9F3B
    u = ((x >> 8).to(tl.float32) + 0.5) / 16777216.0
    return -tl.log(-tl.log(u))


@triton.jit
def sample_rows(logits_ptr, s_logits, n, seen_ptr, s_seen, penalty_ptr, suppress_ptr, s_suppress, greedy_ptr,
                temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, step_ptr, s_step, out_ptr,
                HAS_SEEN: tl.constexpr, HAS_SUPPRESS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    x = tl.load(logits_ptr + row * s_logits + cols, mask=inside, other=float("-inf")).to(tl.float32)
    if HAS_SEEN:
        p = tl.load(penalty_ptr + row)
        seen = tl.load(seen_ptr + row * s_seen + cols, mask=inside, other=0) != 0
        x = tl.where(seen, tl.where(x > 0, tl.math.div_rn(x, p), x * p), x)
    if HAS_SUPPRESS:
        off = tl.load(suppress_ptr + row * s_suppress + cols, mask=inside, other=0) != 0
        x = tl.where(off, float("-inf"), x)
    choice = tl.argmax(x, axis=0, tie_break_left=True)
    if tl.load(greedy_ptr + row) == 0:
        s = tl.math.div_rn(x, tl.load(temperature_ptr + row))
        key = _ordered_key(s)
        keep = inside
        k = tl.load(top_k_ptr + row)
        if (k > 0) & (k < n):  # the k-th largest key: the largest T with at least k keys >= T
            t = tl.zeros((), tl.uint32)
            for bit in tl.static_range(31, -1, -1):
                cand = t | (1 << bit)
                t = tl.where(tl.sum(((key >= cand) & inside).to(tl.int32), axis=0) >= k, cand, t)
            keep = keep & (key >= t)
        top = tl.max(s, axis=0)
        e = tl.where(keep, tl.exp(s - tl.where(top == float("-inf"), 0.0, top)), 0.0)
        top_p = tl.load(top_p_ptr + row)
        if top_p < 1.0:  # the largest T whose mass strictly above it is >= top_p; the nucleus is above T
            target = top_p * tl.sum(e, axis=0)
            t = tl.zeros((), tl.uint32)
            for bit in tl.static_range(31, -1, -1):
                cand = t | (1 << bit)
                t = tl.where(tl.sum(tl.where(key > cand, e, 0.0), axis=0) >= target, cand, t)
            keep = keep & (key > t)
        noise = _gumbel(tl.load(seed_ptr + row), tl.load(step_ptr + row * s_step), cols)
        choice = tl.argmax(tl.where(keep, s + noise, float("-inf")), axis=0, tie_break_left=True)
    tl.store(out_ptr + row, choice.to(tl.int64))
