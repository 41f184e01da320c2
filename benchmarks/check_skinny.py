"""GPU check of models/common/skinny.py: x @ w.T for a few rows, cuBLAS (F.linear) against the Triton kernel's
configs, bf16, at the decode shapes of the code predictor, the talker and the thinker.

For each shape and row count: the time per call (microseconds, median of CUDA events over a CUDA graph of 20
calls) of cuBLAS and of each config, the weight read rate of the best, the way `skinny.linear` picks, and each
way's max |y - float32 reference| over max |reference| (cuBLAS's too, for scale).

  python3 benchmarks/check_skinny.py --out $OUT/skinny.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_pipeline import print_line  # noqa: E402
from benchmarks.check_fused import event_us, graphed  # noqa: E402
from models.common import skinny  # noqa: E402
from pipelines import fastest  # noqa: E402

SHAPES = {  # name: (N, K)
    "predictor.qkv": (4096, 1024), "predictor.o_proj": (1024, 2048), "predictor.gate_up": (6144, 1024),
    "predictor.down_proj": (1024, 3072), "predictor.lm_head": (2048, 1024),
    "talker.qkv": (2560, 1024), "talker.shared.gate_up": (2048, 1024), "talker.codec_head": (3072, 1024),
    "thinker.qkv": (5120, 2048), "thinker.o_proj": (2048, 4096),
}
PER_GRAPH, REPS = 20, 30


def graph_us(fn) -> float:
    """Per call, from a CUDA graph of PER_GRAPH calls."""
    replay, _ = graphed(fn, PER_GRAPH)
    return round(event_us(replay, REPS) / PER_GRAPH, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,16,48")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "configs": skinny.CONFIGS}
    with torch.inference_mode():
        for name, (n, k) in SHAPES.items():
            w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                ref = x.float() @ w.float().T
                ways = {"cublas": lambda x=x, w=w: F.linear(x, w)}
                ways |= {f"triton{c}": (lambda c=c, x=x, w=w: skinny.skinny_mm(x, w, *c)) for c in skinny.CONFIGS}
                row: dict = {}
                for way, fn in ways.items():
                    err = float((fn().float() - ref).abs().max() / ref.abs().max())
                    row[way] = {"us": graph_us(fn), "rel_err": round(err, 5)}
                with fastest.warming_up():
                    skinny.linear(x, w)
                picked = fastest._CHOICE[("skinny", m, (n, k), x.dtype, x.device)]
                best = min(row.values(), key=lambda r: r["us"])["us"]
                row |= {"picked": list(ways)[picked], "best_TBps": round(n * k * 2 / best / 1e6, 2),
                        "cublas_TBps": round(n * k * 2 / row["cublas"]["us"] / 1e6, 2)}
                res[f"{name}_M{m}"] = row
                print(name, m, {w: r["us"] for w, r in row.items() if isinstance(r, dict)}, row["picked"],
                      file=sys.stderr, flush=True)
    print_line(res, args.out)


if __name__ == "__main__":
    main()
