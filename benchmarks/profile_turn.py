"""Where one full-size turn's time goes, eager: GPU busy time vs wall time, kernel launches per stage.

  python benchmarks/profile_turn.py [--frames 25] [--text-tokens 16]

Runs a warm-up turn, then one turn under torch.profiler, and prints one JSON line: wall time, summed
CUDA kernel time, kernel count, and per stage (ModelRunner's record_function ranges) the host time
and step count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_pipeline import speech_like  # noqa: E402
from models.common.tokenizer import Tokenizer  # noqa: E402
from models.qwen3_omni.config import OmniConfig  # noqa: E402
from models.qwen3_omni.model import random_model  # noqa: E402
from models.qwen3_omni.placement import PipelineConfig  # noqa: E402
from models.qwen3_omni.program import Qwen3OmniProgram  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config  # noqa: E402
from pipelines.pipeline import Pipeline  # noqa: E402
from pipelines.types import GenerationOptions, Message, Turn  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--text-tokens", type=int, default=16)
    ap.add_argument("--tiny", action="store_true", help="smoke test: the tiny model on the CPU")
    args = ap.parse_args()
    device = "cpu" if args.tiny else "cuda"
    cfg = OmniConfig.from_hf(tiny_config("a") if args.tiny else json.loads(FULL_CONFIG.read_text()))
    model = random_model(cfg, device, torch.float32 if args.tiny else torch.bfloat16)
    program = Qwen3OmniProgram(model, Tokenizer.builtin(), PipelineConfig.on("random-weights", device))
    messages = [Message("system", " word" * 32), Message("user", "", speech_like(3.0))]
    opts = GenerationOptions(max_text_tokens=args.text_tokens, max_frames=args.frames, ignore_eos=True)
    with Pipeline(program) as pipeline:
        pipeline.run(Turn("warm", messages, opts))
        acts = [torch.profiler.ProfilerActivity.CPU] + ([] if args.tiny else [torch.profiler.ProfilerActivity.CUDA])
        prof = torch.profiler.profile(activities=acts)
        pipeline.request(prof.__enter__).result()  # the profiler follows the thread that starts it
        start = time.perf_counter()
        pipeline.run(Turn("measured", messages, opts))
        wall = time.perf_counter() - start
        pipeline.request(lambda: prof.__exit__(None, None, None)).result()
    kernels = [e for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("stage:")]
    stages: dict = {}
    for e in prof.key_averages():  # a stage range appears twice: on the host and as a GPU annotation
        if e.key.startswith("stage:") and e.cpu_time_total > stages.get(e.key[6:], {}).get("host_ms", -1) * 1e3:
            stages[e.key[6:]] = {"steps": e.count, "host_ms": round(e.cpu_time_total / 1e3, 1)}
    busy_ms = sum(k.device_time for k in kernels) / 1e3
    print(json.dumps({"wall_ms": round(wall * 1e3, 1), "gpu_kernel_ms": round(busy_ms, 1),
                      "gpu_busy_fraction": round(busy_ms / (wall * 1e3), 3), "kernels": len(kernels),
                      "kernels_per_frame_est": round(len(kernels) / args.frames), "stages": stages}))
    sort = "self_cpu_time_total" if args.tiny else "cuda_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=12), file=sys.stderr)


if __name__ == "__main__":
    main()
