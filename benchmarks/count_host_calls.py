"""Torch calls the engine thread makes outside the graph runners' steps (what a CUDA graph replays), per runner call.

Each such call lets the GIL go, and under load the sockets' thread may keep it up to the switch interval before
the engine gets it back: the count is a step's exposure to that wait. The tiny model on CPU (graphs off; the steps
themselves are not counted), `--turns` turns at once, each to its limits:

    python benchmarks/count_host_calls.py --turns 8 --frames 12

Prints the calls per runner call and the functions that made the most; `--aten` counts aten ops instead, by op
(operators and indexing too, which a Python profile cannot see); `--json` one line instead. Then one runner
call of 26 rows and 18 host inputs timed alone and beside a thread that always wants the GIL (bench_step's
`busy_gil`, at the server's 0.1 ms switch interval), the median of `--reps` calls.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_step import busy_gil  # noqa: E402
from models.qwen3_omni.placement import PipelineConfig  # noqa: E402
from models.qwen3_omni.program import build_pipeline  # noqa: E402
from pipelines import graphs  # noqa: E402
from pipelines import pipeline as pipeline_module  # noqa: E402
from pipelines.types import GenerationOptions, Message, Turn  # noqa: E402

ENGINE = "omni-engine"  # pipelines/pipeline.py's thread
# a checkout before the packed inputs (a90b0be) has no Input.on_device: this file runs there too, for the A/B
OURS = ("models", "pipelines")
DEVICE_FED = {"on_device": True} if "on_device" in graphs.Input.__dataclass_fields__ else {}


class Counter:
    def __init__(self) -> None:
        self.on, self.in_step, self.runner_calls = False, 0, 0
        self.by_caller: collections.Counter[str] = collections.Counter()
        self.aten: collections.Counter[str] = collections.Counter()  # aten op -> times, outside the steps

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or self.in_step or event != "c_call" or threading.current_thread().name != ENGINE:
            return
        module = getattr(arg, "__module__", None) or ""
        if module.startswith("torch") or isinstance(getattr(arg, "__self__", None), torch.Tensor):
            code = frame.f_code
            self.by_caller[f"{Path(code.co_filename).name}:{code.co_name}"] += 1

    def uncounted(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, its torch calls counted as a step's (not counted)."""
        def call(*args: Any) -> Any:
            self.in_step += 1
            try:
                return fn(*args)
            finally:
                self.in_step -= 1

        return call

    def wrap(self) -> None:
        """Leave the steps uncounted and count the runner calls."""
        counter, init, call = self, graphs.GraphRunner.__init__, graphs.GraphRunner.__call__

        def counted_init(runner: graphs.GraphRunner, name: str, step: Any, *args: Any, **kwargs: Any) -> None:
            init(runner, name, counter.uncounted(step), *args, **kwargs)

        def counted_call(runner: graphs.GraphRunner, *args: Any, **kwargs: Any) -> graphs.Tensors:
            counter.runner_calls += counter.on
            return call(runner, *args, **kwargs)

        graphs.GraphRunner.__init__, graphs.GraphRunner.__call__ = counted_init, counted_call

    def wrap_aten(self) -> None:
        """Count aten ops in the engine thread (a dispatch mode is per thread: entered in it); a graphed step's
        slicing of its buffers (`views`, eager only) counts as the step."""
        counter, loop = self, pipeline_module.Pipeline._loop

        def counted_loop(pipeline: Any) -> None:
            with AtenOps(counter):
                loop(pipeline)

        pipeline_module.Pipeline._loop = counted_loop
        graphs.GraphRunner.views = self.uncounted(graphs.GraphRunner.views)


class AtenOps(TorchDispatchMode):
    """Counts the aten ops the engine thread runs outside the steps, operators and indexing included: a Python
    profile sees only calls through functions (`a + b`, `t[i]` are invisible to it)."""

    def __init__(self, counter: Counter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        c = self.counter
        if c.on and not c.in_step:
            c.aten[f"{func.overloadpacket.__name__:<12} {ours(sys._getframe(1))}"] += 1
        return func(*args, **(kwargs or {}))


def ours(frame: FrameType | None) -> str:
    """The innermost caller in this repository's serving code (models/, pipelines/), as file:line."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.parent.name in OURS or path.parent.parent.name in OURS:
            return f"{path.parent.name}/{path.name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def noise(seconds: float, seed: int) -> torch.Tensor:
    return torch.randn(int(seconds * 16000), generator=torch.Generator().manual_seed(seed)) * 0.1


async def turns(pipeline: Any, prefix: str, n: int, opts: GenerationOptions) -> None:
    async def one(i: int) -> None:
        async for _ in pipeline.submit(Turn(f"{prefix}{i}", [Message("user", "", noise(1.0, i))], opts)):
            pass

    await asyncio.gather(*(one(i) for i in range(n)))


def call_us(reps: int) -> dict[str, float]:
    """One runner call (18 host inputs, a device-fed one, 26 rows) alone and beside a busy thread, microseconds."""
    spec = {f"i{k}": graphs.Input((), torch.float32) for k in range(16)} | {
        "table": graphs.Input((64,), torch.int32), "flag": graphs.Input((), torch.bool),
        "x": graphs.Input((1, 64), torch.float32, **DEVICE_FED)}
    runner = graphs.GraphRunner("probe", lambda b: {"y": b["x"].sum(-1)}, spec, torch.device("cpu"))
    n = 26
    rows = {f"i{k}": np.ones(n, np.float32) for k in range(16)} | {
        "table": np.zeros((n, 64), np.int32), "flag": [True] * n, "x": torch.ones(n, 1, 64)}

    def median_us() -> float:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            runner(n, rows)
            times.append((time.perf_counter() - t) * 1e6)
        return round(sorted(times)[reps // 2], 1)

    alone = median_us()
    with busy_gil():
        busy = median_us()
    return {"call_us": alone, "call_us_busy_gil": busy}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=8, help="turns at once")
    ap.add_argument("--frames", type=int, default=12, help="codec frames (and text tokens) a reply")
    ap.add_argument("--top", type=int, default=15, help="callers (or aten ops) to list")
    ap.add_argument("--reps", type=int, default=2000, help="timed runner calls, each way")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--aten", action="store_true",
                    help="count aten ops instead (operators and indexing too: what a Python profile cannot see)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    counter = Counter()
    counter.wrap()
    if args.aten:
        counter.wrap_aten()
    else:
        threading.setprofile(counter.profile)
    opts = GenerationOptions(max_text_tokens=args.frames, max_frames=args.frames, ignore_eos=True)
    with build_pipeline(PipelineConfig()) as pipeline:
        asyncio.run(turns(pipeline, "warm", args.turns, opts))
        counter.on = True
        asyncio.run(turns(pipeline, "s", args.turns, opts))
        counter.on = False
    kind, counts = ("aten ops", counter.aten) if args.aten else ("torch calls", counter.by_caller)
    total = sum(counts.values())
    line = {"turns": args.turns, "frames": args.frames, "counted": kind, "calls": total,
            "runner_calls": counter.runner_calls, "per_runner_call": round(total / max(1, counter.runner_calls), 1),
            "top": dict(counts.most_common(args.top))}
    threading.setprofile(None)
    line |= call_us(args.reps)
    if args.json:
        print(json.dumps(line))
        return
    print(f"{total} {kind} outside the steps, {counter.runner_calls} runner calls: {line['per_runner_call']} a call")
    for name, n in line["top"].items():
        print(f"{n:7d}  {name}")
    print(f"one runner call (26 rows, 18 host inputs): {line['call_us']} us alone, {line['call_us_busy_gil']} us "
          "beside a thread that always wants the GIL")


if __name__ == "__main__":
    main()
