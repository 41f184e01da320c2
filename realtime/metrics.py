"""Prometheus metrics of the gateway and the engine, exposed through prometheus_client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pipelines.pipeline import Pipeline

TTFA_BUCKETS_S = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
RTF_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
ENGINE_TIMEOUT_S = 2.0
disable_created_metrics()  # no *_created series: they double the families a reader sees


@dataclass(frozen=True)
class EngineStats:
    kv_used: dict[str, int]  # stage name -> KV blocks in use
    kv_total: dict[str, int]
    steps: dict[str, int]  # stage name -> batches run
    busy_s: dict[str, float]  # stage name -> seconds spent running them
    admission: dict[str, float]  # turns_waiting, turns_waited, admission_wait_s (pipelines/admission.py)


def kv_blocks(pipeline: Pipeline) -> tuple[dict[str, int], dict[str, int]]:
    """KV blocks in use and in all, by stage; runs on the engine thread (`pipeline.request`), as engine_stats."""
    caches = {s.name: s.kv for s in pipeline.stages if s.kv is not None}
    total = {name: kv.layout.num_blocks for name, kv in caches.items()}
    return {name: total[name] - kv.num_free for name, kv in caches.items()}, total


def engine_stats(pipeline: Pipeline) -> EngineStats:
    for s in pipeline.stages:
        if s.kv is not None:
            s.kv.check()  # a scrape also checks every cache's integrity, as Pipeline.kv_check does
    used, total = kv_blocks(pipeline)
    return EngineStats(kv_used=used, kv_total=total, steps={s.name: s.runner.steps for s in pipeline.stages},
                       busy_s={s.name: s.runner.busy_s for s in pipeline.stages},
                       admission=pipeline.program.admission.counters())


class Metrics:
    """What the gateway counts. The session counts are plain ints the server updates; they are read at scrape."""

    def __init__(self) -> None:
        self.sessions = 0
        self.sessions_total = 0
        self.rejected_total = 0
        self.active_responses = 0
        self.engine: EngineStats | None = None
        self.registry = CollectorRegistry()
        self.ttfa = Histogram("omni_time_to_first_audio_seconds",
                              "From the end of the user's turn (commit, or response.create) to the first audio delta.",
                              buckets=TTFA_BUCKETS_S, registry=self.registry)
        self.commit_input = Histogram("omni_commit_input_seconds",
                                      "From a commit to its audio handed to the conversation (the rest of the buffer "
                                      "resampled and encoded on an audio worker); part of the time to first audio.",
                                      buckets=TTFA_BUCKETS_S, registry=self.registry)
        self.rtf = Histogram("omni_rtf", "Real-time factor of responses (generation time / audio time).",
                             buckets=RTF_BUCKETS, registry=self.registry)
        self.milestones = Histogram("omni_turn_milestone_seconds",
                                    "When an ended turn reached each milestone in the engine, seconds after it "
                                    "started there: admitted, prompt (its input encoded), first_text, first_frame, "
                                    "first_audio.",
                                    ["milestone"], buckets=TTFA_BUCKETS_S, registry=self.registry)
        self.errors = Counter("omni_errors", "Errors sent to clients, by code.", ["code"], registry=self.registry)
        self._responses = Counter("omni_responses", "Responses ended, by status (completed, cancelled, incomplete, "
                                  "failed) and error code (failed ones; 'none' otherwise).", ["status", "code"],
                                  registry=self.registry)
        self.registry.register(self)  # its `collect`: the families read from the live state
        for default in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):  # process_*, python_* families
            self.registry.register(default)

    def turn_timings(self, timings: dict[str, float]) -> None:
        """A TurnDone's timings (ms): each milestone into omni_turn_milestone_seconds."""
        for name, ms in timings.items():
            if name.endswith("_ms") and name != "total_ms":
                self.milestones.labels(milestone=name.removesuffix("_ms")).observe(ms / 1e3)

    def response_done(self, status: str, error: dict | None) -> None:
        self._responses.labels(status=status, code=(error or {}).get("code") or "none").inc()

    async def scrape(self, pipeline: Pipeline) -> bytes:
        """The exposition text; engine families only when the engine answers within ENGINE_TIMEOUT_S."""
        self.engine = None
        if pipeline.alive:
            try:
                future = pipeline.request(lambda: engine_stats(pipeline))
                self.engine = await asyncio.wait_for(asyncio.wrap_future(future), ENGINE_TIMEOUT_S)
            except Exception:  # a busy or failing engine must not take /metrics down with it
                self.engine = None
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("omni_sessions_open", "Open realtime sessions.", value=self.sessions)
        yield CounterMetricFamily("omni_sessions_opened", "Realtime sessions opened.", value=self.sessions_total)
        yield CounterMetricFamily("omni_sessions_rejected", "Sessions refused at --max-sessions.",
                                  value=self.rejected_total)
        yield GaugeMetricFamily("omni_responses_active", "Responses in progress.", value=self.active_responses)
        if self.engine is None:
            return
        e = self.engine
        families = (
            (GaugeMetricFamily, "omni_kv_blocks_used", "KV cache blocks in use.", e.kv_used),
            (GaugeMetricFamily, "omni_kv_blocks_capacity", "KV cache blocks in all.", e.kv_total),
            (CounterMetricFamily, "omni_engine_steps", "Batches the stage has run.", e.steps),
            (CounterMetricFamily, "omni_engine_busy_seconds", "Time the stage spent running batches "
                                                              "(divide by steps for the mean step time).", e.busy_s),
        )
        a = e.admission
        yield GaugeMetricFamily("omni_turns_waiting", "Turns waiting to start until the engine keeps its playing "
                                "streams fed.", value=a["turns_waiting"])
        yield CounterMetricFamily("omni_turns_waited", "Turns that started after waiting.", value=a["turns_waited"])
        yield CounterMetricFamily("omni_admission_wait_seconds", "Seconds those turns waited, in all.",
                                  value=a["admission_wait_s"])
        for kind, name, doc, values in families:
            family = kind(name, doc, labels=["stage"])
            for stage, v in sorted(values.items()):
                family.add_metric([stage], v)
            yield family
