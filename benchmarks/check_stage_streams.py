"""Stages' CUDA graphs replayed at once on two streams: the thinker's decode step and the talker's frame step
(full size, random weights, batch --batch) replayed side by side --reps times, each result compared with the
same graph replayed alone on the same inputs (graph replays are deterministic, so any difference is corruption).

Ways of capturing (--way; one per process, as corruption may end in a device-side assert):
- `shared`: as before 2026-12-02, both stages' graphs captured in one memory pool, on torch.cuda.graph's default
  capture stream (one stream, hence one cuBLAS workspace, for every graph);
- `pool`: one pool, each stage's graphs captured on its own stream;
- `stream`: a pool per stage, all captured on torch.cuda.graph's default capture stream;
- `per_stage`: as pipelines/stage.py now does, each stage's graphs in a pool of its own, captured on the
  stage's own stream.
Prints and appends one JSON line: replays whose outputs differed and NaN counts per stage, and the time of a
side-by-side round against the two replayed one after the other.

  for w in per_stage shared pool stream; do python3 benchmarks/check_stage_streams.py --way $w --out $OUT/s.jsonl; done
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_step import filled_cache  # noqa: E402
from models.common.frame_step import FrameStep  # noqa: E402
from models.qwen3_omni.config import OmniConfig  # noqa: E402
from models.qwen3_omni.forward import ThinkerDecode  # noqa: E402
from models.qwen3_omni.model import random_model  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config  # noqa: E402
from pipelines import kv_views  # noqa: E402
from pipelines.graphs import GraphRunner  # noqa: E402
from pipelines.sampling import SamplingParams, sampling_rows  # noqa: E402


def capture_default_stream(runners: list[GraphRunner], one_pool: bool) -> None:
    """The old capture: warm-up on a side stream, then torch.cuda.graph's default capture stream."""
    pool = torch.cuda.graph_pool_handle()
    for r in runners:
        pool = pool if one_pool else torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        for b in sorted(r.buckets, reverse=True):
            r._pad(0, b)
            views = r.views(b)
            with torch.cuda.stream(side):
                r.step(views)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = r.step(views)
            r.graphs[b] = (graph, out)
    torch.cuda.synchronize()


def capture_own_streams(runners: list[GraphRunner], streams: list[torch.cuda.Stream], one_pool: bool) -> None:
    pool = torch.cuda.graph_pool_handle() if one_pool else None
    for r, s in zip(runners, streams, strict=True):
        with torch.cuda.stream(s):
            r.capture(pool)


def outputs(r: GraphRunner, b: int) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in r.graphs[b][1].items()}


def differs(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


def nans(a: dict) -> int:
    return sum(int(v.isnan().sum()) for v in a.values() if v.is_floating_point())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--way", choices=["per_stage", "shared", "pool", "stream"], default="per_stage")
    ap.add_argument("--out")
    args = ap.parse_args()
    dev, dtype, n = "cuda", torch.bfloat16, args.batch
    torch.manual_seed(0)
    cfg = OmniConfig.from_hf(tiny_config("a") if args.tiny else json.loads(FULL_CONFIG.read_text()))
    model = random_model(cfg, dev, dtype)
    greedy = SamplingParams(greedy=True, repetition_penalty=1.05)
    res: dict = {"device": torch.cuda.get_device_name(), "batch": n, "reps": args.reps}
    with torch.inference_mode():
        tcache, tscratch = filled_cache(cfg.thinker.text, n, args.context, dtype, dev)
        twidth = -(-(args.context + 64) // 16)
        kcache, kscratch = filled_cache(cfg.talker.text, n, args.context // 4, dtype, dev)
        kwidth = -(-(args.context // 4 + 64) // 16)
        tv = cfg.talker.text.vocab_size
        seen = torch.zeros(n + 1, tv, dtype=torch.bool, device=dev)
        suppress = torch.zeros(tv, dtype=torch.bool, device=dev)
        keys = [f"s{i}" for i in range(n)]
        for way in (args.way,):
            tstep = ThinkerDecode(model, tcache, cfg.thinker.text.vocab_size)
            kstep = FrameStep(model.talker, kcache, seen, suppress, cfg.talker.codec_eos_id)
            runners = [GraphRunner("thinker", tstep, tstep.inputs(dtype, twidth, tscratch), dev, (n,), True),
                       GraphRunner("talker", kstep, kstep.inputs(dtype, kwidth, kscratch, n), dev, (n,), True)]
            streams = [torch.cuda.Stream(), torch.cuda.Stream()]
            if way in ("shared", "stream"):
                capture_default_stream(runners, one_pool=way == "shared")
            else:
                capture_own_streams(runners, streams, one_pool=way == "pool")
            g = torch.Generator(device=dev).manual_seed(1)
            rows = [kv_views.rows(tcache, keys, twidth) | {
                        "x": torch.randn(n, 1, cfg.thinker.text.hidden_size, device=dev, dtype=dtype, generator=g),
                        "step": [0] * n, "no_eos": [True] * n, **sampling_rows("s", [greedy] * n)},
                    kv_views.rows(kcache, keys, kwidth) | {
                        "x": torch.randn(n, 1, cfg.talker.text.hidden_size, device=dev, dtype=dtype, generator=g),
                        "frame": [3] * n, "slot": list(range(n)), "no_eos": [True] * n,
                        **sampling_rows("t", [greedy] * n), **sampling_rows("p", [SamplingParams(greedy=True)] * n)}]
            alone = []
            for r, s, row in zip(runners, streams, rows, strict=True):  # inputs into the static buffers, once
                with torch.cuda.stream(s):
                    seen.zero_()
                    r(n, row)
                torch.cuda.synchronize()
                alone.append(outputs(r, n))
            bad = [0, 0]
            nan = [0, 0]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            side_ms = []
            for _ in range(args.reps):
                seen.zero_()
                torch.cuda.synchronize()
                start.record()
                for r, s in zip(runners, streams, strict=True):
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        r.graphs[n][0].replay()
                for s in streams:
                    torch.cuda.current_stream().wait_stream(s)
                end.record()
                torch.cuda.synchronize()
                side_ms.append(start.elapsed_time(end))
                for i, r in enumerate(runners):
                    got = outputs(r, n)
                    bad[i] += differs(got, alone[i])
                    nan[i] += nans(got) > 0
            seq_ms = []
            for _ in range(20):
                seen.zero_()
                torch.cuda.synchronize()
                start.record()
                for r in runners:
                    r.graphs[n][0].replay()
                end.record()
                torch.cuda.synchronize()
                seq_ms.append(start.elapsed_time(end))
            res[way] = {"thinker_differs": bad[0], "talker_differs": bad[1], "thinker_nan": nan[0],
                        "talker_nan": nan[1], "side_by_side_ms": round(sorted(side_ms)[len(side_ms) // 2], 3),
                        "one_after_other_ms": round(sorted(seq_ms)[len(seq_ms) // 2], 3)}
            print(way, res[way], file=sys.stderr, flush=True)
            del runners, tstep, kstep
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    line = json.dumps(res)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
