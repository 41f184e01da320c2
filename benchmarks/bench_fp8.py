"""One MoE layer's two grouped GEMMs (w13, SiLU-and-multiply, w2) at decode, three ways: bf16
`torch._grouped_mm`, fp8 `torch._scaled_grouped_mm` with rowwise scales (activations quantized per row in the
timed call, weights per output row), and the Triton block-scaled fp8 kernel (models/common/fp8_moe.py).

Thinker shapes by default (hidden 2048, expert intermediate 768, 128 experts, top-8), batches of 1, 8 and 64
tokens with random routing; the Triton kernel at each --tiles configuration, and at each --prefill-tiles one (a
prefill's wide tiles with 16-bit dots, fp8_moe.PREFILL). For each: median ms
(triton.testing.do_bench, L2 flushed; and replayed from a captured CUDA graph), the weight bytes the routed
experts hold in that format (scales included), the TB/s at the graph's time, and the error against the float32
reference (fp8 block weights dequantized, fp32 matmuls) as max |y - ref| / max |ref|. The weights all three
read are the same fp8 block-quantized values (bf16 holds them dequantized; rowwise re-quantizes them per row).
Prints a table and writes one JSON line to --out.

On the H200:
  python3 benchmarks/bench_fp8.py --out benchmarks/results/$(date -u +%F)_h200_fp8_moe.json
A CPU check that it runs (the kernel under Triton's interpreter, tiny shapes, timings meaningless):
  TRITON_INTERPRET=1 .venv/bin/python benchmarks/bench_fp8.py --device cpu --hidden 256 --intermediate 192 \
      --experts 8 --batches 1,4 --tiles 64:128,32:64 --out /tmp/bench_fp8.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.common import fp8, fp8_moe  # noqa: E402


@dataclass
class Row:
    batch: int
    rows: int
    active_experts: int
    method: str
    ms: float | None = None
    graph_ms: float | None = None
    weight_bytes: int = 0
    tb_s: float | None = None
    rel_err: float | None = None
    error: str = ""


@dataclass
class Weights:
    """One layer's experts in every format the methods read."""

    w13: torch.Tensor  # fp8 block-scaled
    s13: torch.Tensor
    w2: torch.Tensor
    s2: torch.Tensor
    b13: torch.Tensor  # bf16, the fp8 values dequantized
    b2: torch.Tensor
    r13: torch.Tensor  # fp8 rowwise, and its [E, N] float32 scales
    rs13: torch.Tensor
    r2: torch.Tensor
    rs2: torch.Tensor

    @classmethod
    def random(cls, experts: int, hidden: int, inter: int, device: str) -> Weights:
        g = torch.Generator(device=device).manual_seed(0)
        w13 = torch.randn(experts, 2 * inter, hidden, generator=g, device=device) / hidden**0.5
        w2 = torch.randn(experts, hidden, inter, generator=g, device=device) / inter**0.5
        gate, up = fp8.quantize(w13[:, :inter]), fp8.quantize(w13[:, inter:])
        q13, s13 = torch.cat([gate[0], up[0]], 1), torch.cat([gate[1], up[1]], 1)
        q2, s2 = fp8.quantize(w2)
        d13, d2 = fp8_moe.dequantize_split(q13, s13, inter), fp8_moe.dequantize_split(q2, s2)
        return cls(q13, s13, q2, s2, d13.bfloat16(), d2.bfloat16(), *rowwise(d13), *rowwise(d2))


def rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 `t` [..., K] with one float32 scale per row."""
    scale = t.float().abs().amax(-1).clamp_min(1e-12) / fp8.FP8_MAX
    return (t.float() / scale[..., None]).to(fp8.FP8), scale


def layer_bf16(w: Weights, xs: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    gate, up = torch._grouped_mm(xs, w.b13.transpose(1, 2), offs=ends).chunk(2, dim=-1)
    return torch._grouped_mm(F.silu(gate) * up, w.b2.transpose(1, 2), offs=ends)


def layer_rowwise(w: Weights, xs: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    def mm(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        qx, sx = rowwise(x)
        return torch._scaled_grouped_mm(qx, q.transpose(1, 2), sx, s, offs=ends, out_dtype=torch.bfloat16)

    gate, up = mm(xs, w.r13, w.rs13).chunk(2, dim=-1)
    return mm(F.silu(gate) * up, w.r2, w.rs2)


def layer_triton(w: Weights, xs: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    gate, up = fp8_moe.grouped_mm_triton(xs, w.w13, w.s13, ends, w.w13.shape[1] // 2).chunk(2, dim=-1)
    return fp8_moe.grouped_mm_triton(F.silu(gate) * up, w.w2, w.s2, ends)


def reference(w: Weights, xs: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    gate, up = fp8_moe.grouped_mm_reference(xs.float(), w.w13, w.s13, ends, w.w13.shape[1] // 2).chunk(2, dim=-1)
    return fp8_moe.grouped_mm_reference(F.silu(gate) * up, w.w2, w.s2, ends)


METHODS: dict[str, tuple[Callable, Callable[[Weights], tuple[torch.Tensor, ...]]]] = {
    "bf16_grouped_mm": (layer_bf16, lambda w: (w.b13, w.b2)),
    "fp8_rowwise_scaled_grouped_mm": (layer_rowwise, lambda w: (w.r13, w.rs13, w.r2, w.rs2)),
    "fp8_block_triton": (layer_triton, lambda w: (w.w13, w.s13, w.w2, w.s2)),
}


def timed(fn: Callable[[], object], cuda: bool) -> float:
    if cuda:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=200)
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def graph_ms(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compiled and warmed outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=25, rep=200)


def run(method: str, w: Weights, xs: torch.Tensor, ends: torch.Tensor, ref: torch.Tensor, row: Row) -> Row:
    layer, held = METHODS[method]
    row.weight_bytes = row.active_experts * sum(t.nbytes // t.shape[0] for t in held(w))
    cuda = xs.is_cuda
    try:
        y = layer(w, xs, ends)
        row.rel_err = float((y.float() - ref).abs().max() / ref.abs().max())
        row.ms = timed(lambda: layer(w, xs, ends), cuda)
        row.graph_ms = graph_ms(lambda: layer(w, xs, ends)) if cuda else None
        row.tb_s = row.weight_bytes / ((row.graph_ms or row.ms) * 1e-3) / 1e12
    except Exception as e:  # a method this torch or device lacks is reported, not fatal
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--tiles", default="64:128,32:128,128:128,64:64",
                   help="the Triton kernel's TILE_N:TILE_K configurations to time (TILE_K divides 128)")
    p.add_argument("--prefill-tiles", default="",
                   help="also time the kernel's wide tiles (fp8_moe.PREFILL, at every batch here), each "
                        "TILE_M:TILE_N:TILE_K:warps[:stages] (stages 3 unless given), comma-separated "
                        "(e.g. 64:128:128:4,128:128:64:8:4)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    w = Weights.random(args.experts, args.hidden, args.intermediate, args.device)
    g = torch.Generator(device=args.device).manual_seed(1)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        ids = torch.rand(batch, args.experts, generator=g, device=args.device).topk(args.top_k).indices.flatten()
        ids = ids.sort().values
        ends = torch.searchsorted(ids, torch.arange(args.experts, device=args.device), right=True, out_int32=True)
        xs = torch.randn(ids.numel(), args.hidden, generator=g, device=args.device).bfloat16()
        ref = reference(w, xs, ends)
        active = int((torch.diff(ends, prepend=ends.new_zeros(1)) > 0).sum())
        wide = [("fp8_block_triton", t) for t in args.prefill_tiles.split(",") if t]
        for method, tile in [(m, None) for m in METHODS if m != "fp8_block_triton"] + [
                ("fp8_block_triton", t) for t in args.tiles.split(",")] + wide:
            fp8_moe.PREFILL, fp8_moe.PREFILL_ROWS = None, 0
            if tile and tile.count(":") >= 3:  # pipeline stages: 3 unless given
                fp8_moe.PREFILL = (*(int(v) for v in tile.split(":")), 3)[:5]
                name = f"{method}[wide m{tile.replace(':', ',')}]"
            elif tile:
                fp8_moe.TILE_N, fp8_moe.TILE_K = (int(v) for v in tile.split(":"))
                name = f"{method}[m{fp8_moe.TILE_M},n{fp8_moe.TILE_N},k{fp8_moe.TILE_K}]"
            else:
                name = method
            rows.append(run(method, w, xs, ends, ref, Row(batch, ids.numel(), active, name)))
            r = rows[-1]
            print(f"batch {batch:3d} ({active:3d} experts) {name:36s} "
                  + (r.error or f"{r.ms:8.3f} ms  graph {r.graph_ms or float('nan'):8.3f} ms  "
                                f"{r.weight_bytes / 1e6:8.1f} MB  {r.tb_s:6.3f} TB/s  err {r.rel_err:.2e}"),
                  flush=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    line = {"bench": "fp8_moe", "device": device, "torch": torch.__version__, "hidden": args.hidden,
            "intermediate": args.intermediate, "experts": args.experts, "top_k": args.top_k,
            "results": [asdict(r) for r in rows]}
    Path(args.out).write_text(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
