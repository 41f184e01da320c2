"""A window of the GPU's timeline in a running server, from CUDA events: how long each stage's batches took on the
GPU, which ran at once, where the GPU sat idle, and what the longest engine rounds spent it on.

    timeline = GpuTimeline(pipeline, round_of)  # wraps each stage's runner; records while timeline.on
    timeline.on = True; ...; timeline.on = False
    summary = summarize(timeline.take())

A stage runs on a stream of its own (pipelines/stage.py) and ModelRunner.run launches a batch there, so two events
around that call bracket the batch's kernels on the GPU (CUDA graph replays included), and two around a decode's
read-back (an overlapping stage's `finish`) bracket what that launches. A stream reaches a start event once its
earlier work is done, so a span is the batch's own GPU time, shared with whatever other streams ran beside it.
Work a stage does outside its runner (scheduling, hand-offs) is not in any span. `summarize` is the arithmetic,
on plain spans (tested on the CPU). A level's clients speak for --audio-seconds before they commit: the window
starts after that (bench_load's --trace-at) to see the engine's rounds at all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

IDLE_NS = 200_000  # gaps in the GPU's work shorter than this are not counted as idle


@dataclass(frozen=True)
class Span:
    stage: str
    kind: str  # "prefill", "decode" or "finish" (a decode's read-back)
    rows: int
    tokens: int  # new inputs of the batch
    round: int  # the engine iteration it ran in
    start_ns: int
    end_ns: int

    @property
    def ns(self) -> int:
        return self.end_ns - self.start_ns


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


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else 0.0


def _ms(ns: float) -> float:
    return round(ns / 1e6, 2)


def summarize(spans: list[Span], top: int = 3) -> dict:
    """Per stage and kind of batch: count, GPU ms p50 / p95 / max, tokens p50 (rows p50 for decodes); per stage its
    busy ms (the union of its spans) and share of the window; for the whole GPU: busy share, the time two or more
    stages ran at once, the idle gaps (count over IDLE_NS, p50, p95, max, total); and the `top` rounds whose GPU
    work spread longest: that extent, the GPU's busy ms in it, and per stage [GPU ms, prefill tokens]."""
    if not spans:
        return {"spans": 0}
    t0, t1 = min(s.start_ns for s in spans), max(s.end_ns for s in spans)
    window = max(1, t1 - t0)
    out: dict[str, Any] = {"window_ms": _ms(window), "spans": len(spans), "stages": {}}
    by_stage: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_stage[s.stage].append(s)
    for stage, ss in by_stage.items():
        busy = union_ns([(s.start_ns, s.end_ns) for s in ss])
        row: dict[str, Any] = {"busy_ms": _ms(busy), "busy_frac": round(busy / window, 3)}
        for kind in ("prefill", "decode", "finish"):
            ks = [s for s in ss if s.kind == kind]
            if ks:
                size = [s.tokens if kind == "prefill" else s.rows for s in ks]
                row[kind] = {"n": len(ks), "ms_p50_p95_max": [_ms(_pct([s.ns for s in ks], q)) for q in (50, 95, 100)],
                             ("tokens_p50" if kind == "prefill" else "rows_p50"): _pct(size, 50)}
        out["stages"][stage] = row
    pairs = [(s.start_ns, s.end_ns) for s in spans]
    busy = union_ns(pairs)
    gaps = [g for g in idle_gaps_ns(pairs) if g > IDLE_NS]
    out.update(busy_frac=round(busy / window, 3),
               overlap_ms=_ms(sum(union_ns([(s.start_ns, s.end_ns) for s in ss]) for ss in by_stage.values()) - busy),
               idle_gaps=len(gaps), idle_ms_p50_p95_max=[_ms(_pct(gaps, q)) for q in (50, 95, 100)],
               idle_ms_total=_ms(sum(gaps)))
    rounds: dict[int, list[Span]] = defaultdict(list)
    for s in spans:
        rounds[s.round].append(s)
    longest = sorted(rounds.values(), key=lambda ss: max(s.end_ns for s in ss) - min(s.start_ns for s in ss))
    out["longest_rounds"] = [_round(ss) for ss in longest[::-1][:top]]
    return out


def _round(ss: list[Span]) -> dict:
    stages: dict[str, list[float]] = {}
    for s in ss:
        part = stages.setdefault(s.stage, [0.0, 0])
        part[0] += s.ns
        part[1] += s.tokens if s.kind == "prefill" else 0
    return {"gpu_ms": _ms(max(s.end_ns for s in ss) - min(s.start_ns for s in ss)),
            "busy_ms": _ms(union_ns([(s.start_ns, s.end_ns) for s in ss])),
            "stages": {k: [_ms(ns), int(tokens)] for k, (ns, tokens) in stages.items()}}


class GpuTimeline:
    """Events around each stage's batches in a live CUDA pipeline (pipelines.pipeline.Pipeline) while `on`;
    `round_of()` names the engine iteration a batch runs in."""

    def __init__(self, pipeline: Any, round_of: Callable[[], int]) -> None:
        self.on = False
        self.round_of = round_of
        self._events: list[tuple[str, str, int, int, int, torch.cuda.Event, torch.cuda.Event]] = []
        for stage in pipeline.stages:
            stage.runner.run = self._wrap(stage.name, stage.runner.run)

    def _wrap(self, name: str, run: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def timed(batch: Any) -> Any:
            if not self.on:
                return run(batch)
            start = _event()
            finish = run(batch)
            kind = "prefill" if batch.prefill else "decode"
            self._events.append((name, kind, len(batch.works), sum(batch.lengths), self.round_of(), start, _event()))
            if finish is None:
                return None

            def read_back() -> None:
                begin = _event()
                finish()
                self._events.append((name, "finish", len(batch.works), 0, self.round_of(), begin, _event()))

            return read_back

        return timed

    def take(self) -> list[Span]:
        """The spans recorded so far (waits for their events), from the first's start; the record starts anew."""
        events, self._events = self._events, []
        if not events:
            return []
        for *_, end in events:
            end.synchronize()
        base = events[0][5]
        return [Span(name, kind, rows, tokens, r, int(base.elapsed_time(a) * 1e6), int(base.elapsed_time(b) * 1e6))
                for name, kind, rows, tokens, r, a, b in events]


def _event() -> torch.cuda.Event:
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e
