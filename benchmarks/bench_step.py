"""The captured decode steps at full size on one GPU: thinker token (the full sampler's step, and the step for
all-greedy batches) and whole talker frame (sampled with the served defaults), per bucket.

For each batch size: eager time, CUDA-graph replay time (median of CUDA-event timings), host time of
`prepare` (filling the static buffers), a whole runner call (inputs copied, replay, outputs cloned) alone and with
a thread that keeps wanting the GIL (`call_ms_busy_gil`: the server's sockets' thread under load), and
graph == eager (greedy ids identical, float outputs within bf16 tolerance). Random weights, random KV contents
over a fixed context. One JSON line.

  python3 benchmarks/bench_step.py --batches 1,8,64 --context 1024 --out $OUT/step.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_pipeline import print_line  # noqa: E402
from models.common import skinny  # noqa: E402
from models.common.frame_step import FrameStep  # noqa: E402
from models.qwen3_omni.config import OmniConfig  # noqa: E402
from models.qwen3_omni.forward import ThinkerDecode  # noqa: E402
from models.qwen3_omni.model import random_model  # noqa: E402
from models.qwen3_omni.spec import DEFAULTS  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config  # noqa: E402
from pipelines import kv_views, sampling  # noqa: E402
from pipelines.graphs import BUCKETS, GraphRunner  # noqa: E402
from pipelines.kv_cache import KVLayout, PagedKVCache  # noqa: E402
from pipelines.sampling import SamplingParams, sampling_rows  # noqa: E402


def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@contextlib.contextmanager
def busy_gil(switch_s: float = 1e-4) -> Iterator[None]:
    """A thread that wants the GIL all the time (as the server's sockets' thread does under load), at the server's
    switch interval: each torch call that lets the GIL go may then wait up to `switch_s` to get it back."""
    stop, old = threading.Event(), sys.getswitchinterval()

    def spin() -> None:
        while not stop.is_set():
            sum(range(200))

    sys.setswitchinterval(switch_s)
    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old)


def filled_cache(text_cfg, rows: int, context: int, dtype: torch.dtype, device: str) -> tuple[PagedKVCache, int]:
    blocks = rows * (-(-(context + 1) // 16))
    cache = PagedKVCache(KVLayout(text_cfg.num_hidden_layers, text_cfg.num_key_value_heads, text_cfg.head_dim,
                                  blocks, 16, dtype, device))
    for pool in (cache.k, cache.v):
        pool.normal_(0, 1)
    for i in range(rows):
        cache.reserve(f"s{i}", context + 1)
        cache.commit(f"s{i}", context)
    return cache, cache.scratch_slot


def profile(step, views: dict, path: Path) -> None:
    """Kernel count and GPU time by kernel of one eager step (graph replay runs the same kernels)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step(views)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(views)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.device_time for e in events)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70)
    path.write_text(f"kernels {len(events)}, GPU time {total_us / 1e3:.2f} ms\n{table}\n")
    print(path.name, f"kernels {len(events)}, GPU time {total_us / 1e3:.2f} ms", file=sys.stderr, flush=True)


def bench_stage(name: str, step, runner: GraphRunner, cache: PagedKVCache, width: int, batches: list[int],
                extra, reps: int, reset, profile_dir: str | None = None) -> dict:
    out = {}
    for n in batches:
        keys = [f"s{i}" for i in range(n)]
        t0 = time.perf_counter()
        rows = kv_views.rows(cache, keys, width) | extra(n)
        prep_ms = (time.perf_counter() - t0) * 1e3
        reset()
        graph_out = runner(n, rows)
        b = min(x for x in runner.buckets if x >= n)
        reset()
        eager_out = {k: v[:n].clone() for k, v in step(runner.views(b)).items()}
        torch.cuda.synchronize()
        exact, rel = {}, {}
        for k, g in graph_out.items():
            e = eager_out[k]
            if g.is_floating_point():
                rel[k] = float((g.float() - e.float()).norm() / e.float().norm().clamp_min(1e-9))
            else:
                exact[k] = bool(torch.equal(g, e))
        graph, _ = runner.graphs[b]
        t1 = time.perf_counter()
        for _ in range(20):
            runner(n, rows)
        torch.cuda.synchronize()
        call_ms = (time.perf_counter() - t1) * 1e3 / 20
        with busy_gil():
            t1 = time.perf_counter()
            for _ in range(20):
                runner(n, rows)
            torch.cuda.synchronize()
            busy_ms = (time.perf_counter() - t1) * 1e3 / 20
        if profile_dir and n in (batches[0], batches[-1]):
            profile(step, runner.views(b), Path(profile_dir) / f"profile_{name}_B{n}.txt")
        out[f"B{n}"] = {"eager_ms": round(timed(lambda b=b: step(runner.views(b)), max(3, reps // 5)), 2),
                        "graph_ms": round(timed(graph.replay, reps), 3), "call_ms": round(call_ms, 3),
                        "call_ms_busy_gil": round(busy_ms, 3),
                        "prepare_host_ms": round(prep_ms, 3), "bucket": b, "ids_equal": exact, "rel_err": rel}
        print(name, n, out[f"B{n}"], file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--context", type=int, default=1024, help="cached tokens per row (thinker); the talker gets 1/4")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out")
    ap.add_argument("--quantization", choices=["fp8"], help="fp8: the MoE experts kept in fp8 (serve's flag)")
    ap.add_argument("--profile-dir", help="write an eager kernel profile of the first batch size here")
    ap.add_argument("--stages", default="thinker,talker", help="which steps to measure")
    ap.add_argument("--torch-sampling", action="store_true",
                    help="the codec heads' sampler as torch ops, not the kernel (sampling.FUSED)")
    ap.add_argument("--cublas", action="store_true", help="every linear through cuBLAS, not skinny.py's choice")
    args = ap.parse_args()
    sampling.FUSED = not args.torch_sampling
    skinny.ENABLED = not args.cublas
    stages = args.stages.split(",")
    dev, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    cfg = OmniConfig.from_hf(tiny_config("a") if args.tiny else json.loads(FULL_CONFIG.read_text()))
    model = random_model(cfg, dev, dtype, quantization=args.quantization)
    batches = [int(x) for x in args.batches.split(",")]
    buckets = tuple(b for b in BUCKETS if b <= max(batches)) or BUCKETS[:1]
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "context": args.context,
                 "fused_sampling": sampling.FUSED, "skinny": skinny.ENABLED,
                 "quantization": args.quantization, "weights_GiB": round(torch.cuda.memory_allocated() / 2**30, 1)}
    greedy = SamplingParams(greedy=True, repetition_penalty=1.05)
    with torch.inference_mode():
        top = max(batches)
        # thinker
        cache, scratch = filled_cache(cfg.thinker.text, top, args.context, dtype, dev)
        width = -(-(args.context + 64) // 16)
        vocab = cfg.thinker.text.vocab_size
        h = cfg.thinker.text.hidden_size

        def thinker_rows(n: int) -> dict:
            return {"x": torch.randn(n, 1, h, device=dev, dtype=dtype), "step": [0] * n, "no_eos": [True] * n,
                    **sampling_rows("s", [greedy] * n)}
        for name, only_greedy in (("thinker", False), ("thinker_greedy", True)) if "thinker" in stages else ():
            step = ThinkerDecode(model, cache, vocab, only_greedy)
            runner = GraphRunner(name, step, step.inputs(dtype, width, scratch), dev, buckets, graphs=True)
            runner.capture()
            res[f"{name}_capture_s"] = round(runner.capture_s, 2)
            res[name] = bench_stage(name, step, runner, cache, width, batches, thinker_rows, args.reps,
                                    lambda: None, args.profile_dir)
            del runner, step
        del cache
        torch.cuda.empty_cache()
        if "talker" not in stages:
            print_line(res, args.out)
            return
        tctx = args.context // 4
        cache, scratch = filled_cache(cfg.talker.text, top, tctx, dtype, dev)
        width = -(-(tctx + 64) // 16)
        tv = cfg.talker.text.vocab_size
        seen = torch.zeros(top + 1, tv, dtype=torch.bool, device=dev)
        suppress = torch.zeros(tv, dtype=torch.bool, device=dev)
        suppress[tv - 1024:] = True
        suppress[cfg.talker.codec_eos_id] = False
        step = FrameStep(model.talker, cache, seen, suppress, cfg.talker.codec_eos_id)
        runner = GraphRunner("talker", step, step.inputs(dtype, width, scratch, top), dev, buckets, graphs=True)
        runner.capture()
        res["talker_capture_s"] = round(runner.capture_s, 2)
        ht = cfg.talker.text.hidden_size

        def talker_rows(n: int) -> dict:
            return {"x": torch.randn(n, 1, ht, device=dev, dtype=dtype), "frame": [3] * n, "slot": list(range(n)),
                    "no_eos": [True] * n, **sampling_rows("t", [DEFAULTS["talker"]] * n),
                    **sampling_rows("p", [DEFAULTS["predictor"]] * n)}  # sampled, as served
        res["talker_frame"] = bench_stage("talker", step, runner, cache, width, batches, talker_rows, args.reps,
                                          seen.zero_, args.profile_dir)
    res["max_memory_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    print_line(res, args.out)


if __name__ == "__main__":
    main()
