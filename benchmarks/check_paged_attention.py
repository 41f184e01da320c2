"""GPU check of the paged decode kernel against the torch reference, bf16, random inputs.

For the thinker (32 query heads, 4 kv heads) and talker (16, 2) shapes, head dim 128, block size 16, at
batch 1/8/64 and contexts 256/1024/4096 (rows end 0..15 keys short of the context, on scattered blocks):
the kernel's error against the float32 reference (also with the last row made padding), and median
times (triton.testing.do_bench, L2 flushed between runs) of the bf16 reference, the kernel, and the
kernel replayed from a captured CUDA graph. Prints a table, then one JSON line; exits 1 on a mismatch.

  python3 benchmarks/check_paged_attention.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.paged_attention import (  # noqa: E402
    default_partition,
    paged_decode_reference,
    paged_decode_triton,
)

SHAPES = {"thinker": (32, 4, 128), "talker": (16, 2, 128)}
BATCHES = (1, 8, 64)
CONTEXTS = (256, 1024, 4096)
BLOCK_SIZE = 16
REL_TOL = 2e-2


def make_inputs(batch: int, context: int, hq: int, hkv: int, d: int):
    per_row = context // BLOCK_SIZE
    num_blocks = batch * per_row + 7  # a few blocks no row owns
    table = torch.randperm(num_blocks, device="cuda")[: batch * per_row].reshape(batch, per_row).to(torch.int32)
    seq_lens = context - torch.randint(0, BLOCK_SIZE, (batch,), device="cuda", dtype=torch.int32)
    seq_lens[0] = context
    k = torch.randn(num_blocks * BLOCK_SIZE, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(num_blocks * BLOCK_SIZE, hkv, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, hq, d, device="cuda", dtype=torch.bfloat16)
    return q, k, v, table.contiguous(), seq_lens


def errors(q, k, v, table, seq_lens, scale) -> tuple[float, float]:
    out = paged_decode_triton(q, k, v, table, seq_lens, scale, BLOCK_SIZE)
    assert out.shape == q.shape and out.dtype == q.dtype, (out.shape, out.dtype)
    ref = paged_decode_reference(q.float(), k.float(), v.float(), table, seq_lens, scale, BLOCK_SIZE)
    diff = out.float() - ref
    return (diff.norm() / ref.norm().clamp_min(1e-30)).item(), diff.abs().max().item()


def check(name: str, batch: int, context: int) -> dict:
    hq, hkv, d = SHAPES[name]
    q, k, v, table, seq_lens = make_inputs(batch, context, hq, hkv, d)
    scale = 1 / math.sqrt(d)
    args = (q, k, v, table, seq_lens, scale, BLOCK_SIZE)
    rel, max_abs = errors(q, k, v, table, seq_lens, scale)
    padded = seq_lens.clone()
    padded[-1] = 0
    rel_pad, max_abs_pad = errors(q, k, v, table, padded, scale)
    pad_zero = bool((paged_decode_triton(q, k, v, table, padded, scale, BLOCK_SIZE)[-1] == 0).all())

    eager = paged_decode_triton(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = paged_decode_triton(*args)
    graph.replay()
    torch.cuda.synchronize()
    graph_equal = torch.equal(static_out, eager)

    def bench(fn) -> float:
        return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1000  # microseconds

    ref_us = bench(lambda: paged_decode_reference(*args))
    kernel_us = bench(lambda: paged_decode_triton(*args))
    graph_us = bench(graph.replay)
    del graph, static_out
    kv_bytes = 2 * int(seq_lens.sum()) * hkv * d * k.element_size()
    part = default_partition(batch, hkv, context, q.device)
    ok = max(rel, rel_pad) < REL_TOL and pad_zero and graph_equal and math.isfinite(max_abs + max_abs_pad)
    return dict(
        shape=name, batch=batch, context=context, partition=part, partitions=-(-context // part),
        rel_err=rel, max_abs=max_abs, rel_err_padded=rel_pad, max_abs_padded=max_abs_pad, padding_row_zero=pad_zero,
        graph_equal=graph_equal, ref_us=ref_us, kernel_us=kernel_us, graph_us=graph_us,
        kernel_tb_s=kv_bytes / kernel_us / 1e6, graph_tb_s=kv_bytes / graph_us / 1e6, ok=ok,
    )


def main() -> int:
    assert torch.cuda.is_available(), "this check needs a CUDA GPU"
    torch.manual_seed(0)
    rows = [check(name, b, c) for name in SHAPES for b in BATCHES for c in CONTEXTS]
    print(f"{'shape':8} {'B':>3} {'ctx':>5} {'P':>3} {'rel err':>8} {'max abs':>8} "
          f"{'ref us':>8} {'kernel us':>9} {'graph us':>8} {'TB/s':>5} ok")
    for r in rows:
        print(f"{r['shape']:8} {r['batch']:3d} {r['context']:5d} {r['partitions']:3d} {r['rel_err']:8.1e} "
              f"{r['max_abs']:8.1e} {r['ref_us']:8.1f} {r['kernel_us']:9.1f} {r['graph_us']:8.1f} "
              f"{r['graph_tb_s']:5.2f} {r['ok']}")
    summary = dict(
        check="paged_decode_attention", device=torch.cuda.get_device_name(), torch=torch.__version__,
        triton=triton.__version__, block_size=BLOCK_SIZE, dtype="bfloat16", ok=all(r["ok"] for r in rows), rows=rows,
    )
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
