"""A window of the GPU's timeline in a running server: which stage's kernels ran when, and when the GPU sat idle.

    trace = GpuTrace(pipeline)            # on a CUDA pipeline, in the server's process
    trace.start(); ...; summary = trace.stop()

torch.profiler records every kernel of the process (CUDA graph replays included) with its stream. A stage runs on
a stream of its own (pipelines/stage.py), so a stream names its stage: at `start` the engine thread puts one spin
kernel of a length of its own on each stage's stream, and the kernel's length says whose stream it ran on.
`summarize` is the arithmetic, on plain tuples (tested on the CPU).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

MARK = "spin_kernel"  # in the name of torch.cuda._sleep's kernel
MARK_CYCLES = 200_000  # stage i's mark spins (i + 1) times this (about 0.1 ms each at the H200's clock)
STEP_GAP_NS = 300_000  # a stage's kernels with no gap this long between them are one step


@dataclass(frozen=True)
class Kernel:
    name: str
    stream: int
    start_ns: int
    end_ns: int


def union_ns(spans: list[tuple[int, int]]) -> int:
    """Total length of the union of [start, end) spans."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def idle_gaps_ns(spans: list[tuple[int, int]]) -> list[int]:
    """Lengths of the gaps between the spans' union, in order."""
    gaps, reach = [], None
    for start, end in sorted(spans):
        if reach is not None and start > reach:
            gaps.append(start - reach)
        reach = end if reach is None else max(reach, end)
    return gaps


def steps_ns(spans: list[tuple[int, int]], gap_ns: int = STEP_GAP_NS) -> list[tuple[int, int]]:
    """The spans grouped into steps: a gap longer than `gap_ns` starts a new one; each step's (start, end)."""
    steps: list[list[int]] = []
    for start, end in sorted(spans):
        if steps and start - steps[-1][1] <= gap_ns:
            steps[-1][1] = max(steps[-1][1], end)
        else:
            steps.append([start, end])
    return [(a, b) for a, b in steps]


def stage_of_streams(kernels: list[Kernel], stages: list[str]) -> dict[int, str]:
    """Stream -> stage, from the marks: the k-th shortest mark ran on stage k's stream."""
    marks = sorted((k for k in kernels if MARK in k.name), key=lambda k: k.end_ns - k.start_ns)
    return {k.stream: stages[i] for i, k in enumerate(marks[: len(stages)])}


def _pct(xs: list[int], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else 0.0


def summarize(kernels: list[Kernel], stages: list[str], top: int = 8) -> dict:
    """Per stage: kernels, busy ms (their union) and share of the window, its steps (kernels with no gap over
    STEP_GAP_NS between them) and their lengths, the kernels taking most time; for the
    whole GPU: busy share, the time two or more stages ran at once, and the idle gaps (count over 0.2 ms, p50,
    p95, max, total)."""
    names = stage_of_streams(kernels, stages)
    work = [k for k in kernels if MARK not in k.name]
    if not work:
        return {"kernels": 0}
    t0, t1 = min(k.start_ns for k in work), max(k.end_ns for k in work)
    window = max(1, t1 - t0)
    by_stage: dict[str, list[Kernel]] = defaultdict(list)
    for k in work:
        by_stage[names.get(k.stream, f"stream {k.stream}")].append(k)
    out: dict = {"window_ms": round(window / 1e6, 1), "kernels": len(work), "stages": {}}
    for stage, ks in sorted(by_stage.items()):
        busy = union_ns([(k.start_ns, k.end_ns) for k in ks])
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for k in ks:
            t = totals[k.name[:70]]
            t[0] += (k.end_ns - k.start_ns) / 1e6
            t[1] += 1
        heavy = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
        steps = steps_ns([(k.start_ns, k.end_ns) for k in ks])
        lengths = [b - a for a, b in steps]
        out["stages"][stage] = {"kernels": len(ks), "busy_ms": round(busy / 1e6, 1),
                                "busy_frac": round(busy / window, 3), "steps": len(steps),
                                "step_ms_p50_p95": [round(_pct(lengths, q) / 1e6, 2) for q in (50, 95)],
                                "top": [[name, round(ms, 2), n] for name, (ms, n) in heavy]}
    spans = [(k.start_ns, k.end_ns) for k in work]
    busy = union_ns(spans)
    per_stage = sum(union_ns([(k.start_ns, k.end_ns) for k in ks]) for ks in by_stage.values())
    gaps = [g for g in idle_gaps_ns(spans) if g > 200_000]
    out.update(busy_frac=round(busy / window, 3), overlap_ms=round((per_stage - busy) / 1e6, 1),
               idle_gaps_over_0_2ms=len(gaps),
               idle_ms_p50_p95_max=[round(_pct(gaps, q) / 1e6, 2) for q in (50, 95, 100)],
               idle_ms_total=round(sum(gaps) / 1e6, 1))
    return out


class GpuTrace:
    """torch.profiler over CUDA kernels for a window of a live pipeline (pipelines.pipeline.Pipeline)."""

    def __init__(self, pipeline: object) -> None:
        self.pipeline = pipeline
        self.prof: torch.profiler.profile | None = None

    def start(self) -> None:
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        self.prof.__enter__()
        self.pipeline.request(self._mark).result(60)

    def _mark(self) -> None:
        for i, stage in enumerate(self.pipeline.stages):
            if stage.stream is not None:
                with torch.cuda.stream(stage.stream):
                    torch.cuda._sleep((i + 1) * MARK_CYCLES)

    def stop(self) -> dict:
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        kernels = [Kernel(e.name(), e.device_resource_id(), e.start_ns(), e.end_ns())
                   for e in prof.profiler.kineto_results.events()
                   if e.device_type() == torch.autograd.DeviceType.CUDA and e.duration_ns() > 0]
        stages = [s.name for s in self.pipeline.stages if s.stream is not None]
        return summarize(kernels, stages)
