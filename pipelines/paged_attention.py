"""Decode attention over the paged KV cache, reading each row's block table on the device.

One query per row (its newest token, K/V already cached) attends to keys 0..seq_len-1 of its row in one layer's pool
([num_slots, Hkv, D]). The Triton kernel is flash-decoding: grid (B, Hkv, P) over P partitions of the table's width, so
shapes are fixed and a call can be captured in a CUDA graph; a program reads its partition's K/V once for all query
heads of its kv head, and a second kernel merges partitions by log-sum-exp. Lengths past the table's width are clamped
(a device kernel cannot raise). `paged_decode_reference`, in plain torch, is the tests' reference and the CPU path."""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference serves
    triton = None

TILE = 64  # keys per inner step of the kernel
# Triton's interpreter before 3.8 cannot run `for` over loaded bounds (numpy 2.4): it runs `while` instead.
INTERPRET_WHILE = triton is not None and os.environ.get("TRITON_INTERPRET") == "1" and tuple(
    int(x) for x in triton.__version__.split(".")[:2]) < (3, 8)


def _check(q, k_cache, v_cache, block_table, seq_lens, block_size) -> None:
    if q.dim() != 3 or k_cache.dim() != 3:
        raise ValueError(f"q must be [B, Hq, D] and the caches [num_slots, Hkv, D], got {tuple(q.shape)}, "
                         f"{tuple(k_cache.shape)}")
    (b, hq, d), (slots, hkv, dk) = q.shape, k_cache.shape
    if v_cache.shape != k_cache.shape or dk != d:
        raise ValueError(f"k/v caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)} do not match q's head dim {d}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} kv heads")
    if block_table.dim() != 2 or block_table.shape[0] != b or tuple(seq_lens.shape) != (b,):
        raise ValueError(f"block_table must be [{b}, max_blocks] and seq_lens [{b}], got "
                         f"{tuple(block_table.shape)}, {tuple(seq_lens.shape)}")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("block_table and seq_lens must be int32")
    if block_size < 1 or slots % block_size:
        raise ValueError(f"block_size {block_size} does not divide the pool's {slots} slots")
    if len({t.device for t in (q, k_cache, v_cache, block_table, seq_lens)}) != 1:
        raise ValueError("all tensors must be on one device")


def paged_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float, block_size: int) -> torch.Tensor:
    """Gathers every row's table-wide slots, masks keys past seq_len, softmax in float32."""
    _check(q, k_cache, v_cache, block_table, seq_lens, block_size)
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    width = block_table.shape[1] * block_size
    if not seq_lens.is_cuda and bool((seq_lens > width).any()):
        raise ValueError(f"seq_lens {seq_lens.tolist()} exceed the block table's {width} keys")
    pos = torch.arange(width, device=q.device)
    visible = pos[None, :] < seq_lens[:, None].long()  # [B, L]
    slots = block_table[:, pos // block_size].long() * block_size + pos % block_size
    slots = torch.where(visible, slots, 0)  # table entries past a row's blocks may be anything
    keys = k_cache[slots].float().masked_fill(~visible[:, :, None, None], 0)  # [B, L, Hkv, D]
    values = v_cache[slots].float().masked_fill(~visible[:, :, None, None], 0)
    qg = q.float().reshape(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, keys) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no keys gives zeros
    out = torch.einsum("bhgl,blhd->bhgd", probs, values)
    return out.reshape(b, hq, d).to(q.dtype)


if triton is not None:

    @triton.jit
    def _attend_tile(q, m, l, acc, start, hi, bt_row, k_head, v_head, sk_s, sv_s, scale_log2, dims, dim_ok,
                     BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, PRECISION: tl.constexpr):
        """Keys start..start+TILE_N-1 (those below hi) folded into the running max m, sum l and output acc."""
        keys = start + tl.arange(0, TILE_N)
        key_ok = keys < hi
        block = tl.load(bt_row + keys // BLOCK_SIZE, mask=key_ok, other=0)
        slot = (block.to(tl.int64) * BLOCK_SIZE + keys % BLOCK_SIZE)[:, None]
        kv_ok = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_head + slot * sk_s + dims[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_head + slot * sv_s + dims[None, :], mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * scale_log2
        s = tl.where(key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
        return m_new, l, acc

    @triton.jit
    def _partition_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, len_ptr, part_out_ptr, part_lse_ptr, out_ptr, sq_b, sq_h, sk_s,
                          sk_h, sv_s, sv_h, sbt_b, scale_log2, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                          D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, MAX_BLOCKS: tl.constexpr,
                          PART: tl.constexpr, TILE_N: tl.constexpr, NUM_PARTS: tl.constexpr, PRECISION: tl.constexpr,
                          LOOP_WHILE: tl.constexpr):
        row, kv_head, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        seq_len = tl.minimum(tl.load(len_ptr + row), MAX_BLOCKS * BLOCK_SIZE)
        lo = part * PART
        hi = tl.minimum(lo + PART, seq_len)
        heads = kv_head * GROUP + tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, D_PAD)
        head_ok, dim_ok = tl.arange(0, GROUP_PAD) < GROUP, dims < D
        q = tl.load(q_ptr + row * sq_b + heads[:, None] * sq_h + dims[None, :],
                    mask=head_ok[:, None] & dim_ok[None, :], other=0.0)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
        bt_row, k_head, v_head = bt_ptr + row * sbt_b, k_ptr + kv_head * sk_h, v_ptr + kv_head * sv_h
        if LOOP_WHILE:
            start = lo
            while start < hi:
                m, l, acc = _attend_tile(q, m, l, acc, start, hi, bt_row, k_head, v_head, sk_s, sv_s, scale_log2,
                                         dims, dim_ok, BLOCK_SIZE, TILE_N, PRECISION)
                start += TILE_N
        else:  # on the GPU `for` is software-pipelined (cp.async); `while` is not
            for start in range(lo, hi, TILE_N):
                m, l, acc = _attend_tile(q, m, l, acc, start, hi, bt_row, k_head, v_head, sk_s, sv_s, scale_log2,
                                         dims, dim_ok, BLOCK_SIZE, TILE_N, PRECISION)
        l = tl.where(l > 0, l, 1.0)  # a partition with no keys: zeros, and its lse is never read
        out = acc / l[:, None]
        store_ok = head_ok[:, None] & dim_ok[None, :]
        if NUM_PARTS == 1:  # the only partition: write the answer (zeros for an empty row)
            tl.store(out_ptr + (row * GROUP * tl.num_programs(1) + heads[:, None]) * D + dims[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=store_ok)
        else:
            at = (row * GROUP * tl.num_programs(1) + heads) * NUM_PARTS + part
            written = tl.arange(0, GROUP_PAD) < tl.where(lo < seq_len, GROUP, 0)  # none for an empty partition
            tl.store(part_out_ptr + at[:, None] * D + dims[None, :], out, mask=written[:, None] & dim_ok[None, :])
            tl.store(part_lse_ptr + at, m + tl.log2(l), mask=written)

    @triton.jit
    def _merge_kernel(len_ptr, part_out_ptr, part_lse_ptr, out_ptr, D: tl.constexpr, D_PAD: tl.constexpr,
                      CONTEXT: tl.constexpr, PART: tl.constexpr, NUM_PARTS: tl.constexpr, PARTS_PAD: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        used = tl.cdiv(tl.minimum(tl.load(len_ptr + row), CONTEXT), PART)
        parts, dims = tl.arange(0, PARTS_PAD), tl.arange(0, D_PAD)
        part_ok, dim_ok = parts < used, dims < D
        at = (row * tl.num_programs(1) + head) * NUM_PARTS + parts
        lse = tl.load(part_lse_ptr + at, mask=part_ok, other=float("-inf"))
        top = tl.where(used > 0, tl.max(lse, axis=0), 0.0)
        w = tl.exp2(lse - top)
        o = tl.load(part_out_ptr + at[:, None] * D + dims[None, :], mask=part_ok[:, None] & dim_ok[None, :], other=0.0)
        total = tl.sum(w, axis=0)
        out = tl.sum(w[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
        tl.store(out_ptr + (row * tl.num_programs(1) + head) * D + dims, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


def default_partition(batch: int, kv_heads: int, context: int, device: torch.device) -> int:
    """Keys per partition: enough programs to fill the GPU about four times over at this batch."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 64
    parts = -(-4 * sms // (batch * kv_heads))
    return min(max(triton.next_power_of_2(-(-context // parts)), 2 * TILE), 4096)


def paged_decode_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor, scale: float, block_size: int,
                        partition: int | None = None) -> torch.Tensor:
    """The Triton kernel; `partition` (keys per partition, a power of two >= 16) overrides the default."""
    _check(q, k_cache, v_cache, block_table, seq_lens, block_size)
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1 or q.stride(2) != 1 or block_table.stride(1) != 1:
        raise ValueError("q, the caches and block_table need a contiguous last dimension")
    context = block_table.shape[1] * block_size
    part = partition or default_partition(b, hkv, context, q.device)
    if part < 16 or part & (part - 1):
        raise ValueError(f"partition {part} is not a power of two >= 16")
    num_parts = max(1, -(-context // part))
    group = hq // hkv
    out = torch.empty(b, hq, d, dtype=q.dtype, device=q.device)
    part_out = torch.empty(b, hq, num_parts, d, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(b, hq, num_parts, dtype=torch.float32, device=q.device)
    d_pad = max(16, triton.next_power_of_2(d))
    _partition_kernel[(b, hkv, num_parts)](
        q, k_cache, v_cache, block_table, seq_lens, part_out, part_lse, out, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), block_table.stride(0),
        scale * 1.4426950408889634, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=d, D_PAD=d_pad,
        BLOCK_SIZE=block_size, MAX_BLOCKS=block_table.shape[1], PART=part, TILE_N=min(TILE, part), NUM_PARTS=num_parts,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", LOOP_WHILE=INTERPRET_WHILE)
    if num_parts > 1:
        _merge_kernel[(b, hq)](seq_lens, part_out, part_lse, out, D=d, D_PAD=d_pad, CONTEXT=context, PART=part,
                               NUM_PARTS=num_parts, PARTS_PAD=triton.next_power_of_2(num_parts))
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float, block_size: int) -> torch.Tensor:
    """[B, Hq, D] decode attention: the Triton kernel on CUDA where triton imports, else the reference."""
    if q.is_cuda and triton is not None:
        return paged_decode_triton(q, k_cache, v_cache, block_table, seq_lens, scale, block_size)
    return paged_decode_reference(q, k_cache, v_cache, block_table, seq_lens, scale, block_size)
