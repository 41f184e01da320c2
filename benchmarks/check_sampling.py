"""GPU check of the sampler's Triton kernel (pipelines/sampling_kernel.py) against its torch path, at the codec
heads' sizes: the talker's codebook 0 (3,072 ids: temperature 0.9, top-k 50, repetition penalty 1.05, suppressed
ids) and the code predictor's (2,048 ids: top-k 50, top-p 0.8), bf16 logits.

For each case and batch: the fraction of draws where the kernel's id equals the torch path's (over STEPS steps;
they may differ only where top-p's cut lands within float rounding of a run's mass), and the time per sampling
step (microseconds, median of CUDA events over a CUDA graph of 15 steps, as the predictor's frame holds).

  python3 benchmarks/check_sampling.py --out $OUT/sampling.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_pipeline import print_line  # noqa: E402
from benchmarks.check_fused import event_us, graphed  # noqa: E402
from pipelines import sampling  # noqa: E402
from pipelines.sampling import Sampler, SamplingParams  # noqa: E402

CASES = {"talker": (3072, SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05)),
         "predictor": (2048, SamplingParams(top_k=50, top_p=0.8))}
STEPS, PER_GRAPH, REPS = 200, 15, 50


def graph_us(fn) -> float:
    """Per call, from a CUDA graph of PER_GRAPH calls."""
    replay, _ = graphed(fn, PER_GRAPH)
    return round(event_us(replay, REPS) / PER_GRAPH, 2)


def run_case(v: int, params: SamplingParams, b: int) -> dict:
    dev = "cuda"
    logits = (torch.randn(b, v, device=dev) * 3).to(torch.bfloat16)
    seen = torch.rand(b, v, device=dev) < 0.05
    suppress = torch.zeros(v, dtype=torch.bool, device=dev)
    suppress[v - 1024:] = v > 2048  # the talker's control ids
    s = Sampler.of([SamplingParams(**{**params.__dict__, "seed": i}) for i in range(b)], dev)
    s.all_greedy, s.any_penalty = False, True  # as a captured step keeps them
    equal = total = 0
    for step in range(STEPS):
        steps = torch.full((b,), step, device=dev)
        sampling.FUSED = True
        got = s(logits, steps, seen, suppress)
        sampling.FUSED = False
        want = s(logits, steps, seen, suppress)
        equal += int((got == want).sum())
        total += b
    steps = torch.zeros(b, dtype=torch.long, device=dev)
    out = {"ids_equal": round(equal / total, 5), "draws": total}
    for fused in (False, True):
        sampling.FUSED = fused
        out["fused_us" if fused else "torch_us"] = graph_us(lambda: s(logits, steps, seen, suppress))
    sampling.FUSED = True
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,48,64")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with torch.inference_mode():
        for name, (v, params) in CASES.items():
            for b in (int(x) for x in args.batches.split(",")):
                res[f"{name}_B{b}"] = run_case(v, params, b)
                print(name, b, res[f"{name}_B{b}"], file=sys.stderr, flush=True)
    print_line(res, args.out)


if __name__ == "__main__":
    main()
