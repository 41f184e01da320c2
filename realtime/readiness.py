"""`GET /health/ready`: whether this replica should take new sessions now; and its capacity as /metrics gauges."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from pipelines.pipeline import Pipeline

from .metrics import Metrics, kv_blocks

KV_READ_TIMEOUT_S = 1.0  # the engine answers between steps; a busy step must not stall the probe
KV_READ_EVERY_S = 0.5  # probes more often than this reuse the last reading


def conversations_free(typical: int, used: dict[str, int], total: dict[str, int]) -> int:
    """Conversations of a typical length that still fit (`typical` in empty caches); the fullest cache decides."""
    free = min((1 - used.get(name, 0) / n for name, n in total.items() if n), default=1.0)
    return int(typical * free)


class Readiness:
    def __init__(self, pipeline: Pipeline, metrics: Metrics, max_sessions: int, draining: Callable[[], bool]) -> None:
        self.pipeline, self.metrics, self.max_sessions, self.draining = pipeline, metrics, max_sessions, draining
        self.loaded = False
        self.kv_free: int | None = None  # last reading; None until the engine has answered once
        self._kv_read_at = 0.0
        metrics.registry.register(self)  # its `collect`: the capacity families

    async def on_startup(self, app: object) -> None:
        self.loaded = True

    async def reason(self) -> str | None:
        if not self.loaded:
            return "loading"
        if self.draining():
            return "draining"
        if not self.pipeline.alive:
            return "engine_stopped"
        if self.metrics.sessions >= self.max_sessions:
            return "full_sessions"
        await self._read_kv()
        if self.kv_free is not None and self.kv_free < 1:
            return "full_kv_cache"
        return None

    async def _read_kv(self) -> None:
        if time.monotonic() - self._kv_read_at < KV_READ_EVERY_S:
            return
        self._kv_read_at = time.monotonic()
        try:
            future = self.pipeline.request(lambda: conversations_free(self.pipeline.capacity()["sessions"],
                                                                      *kv_blocks(self.pipeline)))
            self.kv_free = await asyncio.wait_for(asyncio.wrap_future(future), KV_READ_TIMEOUT_S)
        except Exception:  # a busy engine keeps the last reading
            pass

    def collect(self) -> Iterator[Metric]:
        r, m = self, self.metrics
        ready = r.loaded and not r.draining() and m.sessions < r.max_sessions and (r.kv_free is None or r.kv_free > 0)
        yield GaugeMetricFamily("omni_ready", "1 when /health/ready answers 200 (as of the last KV reading).",
                                value=int(ready))
        yield GaugeMetricFamily("omni_draining", "1 from the first SIGTERM until exit.", value=int(r.draining()))
        yield GaugeMetricFamily("omni_sessions_max", "The sessions cap (--max-sessions).", value=r.max_sessions)
        yield GaugeMetricFamily("omni_sessions_free", "Sessions this replica can still open (cap minus open).",
                                value=max(0, r.max_sessions - m.sessions))
        if m.engine is not None:
            free = conversations_free(r.pipeline.capacity()["sessions"], m.engine.kv_used, m.engine.kv_total)
            yield GaugeMetricFamily("omni_kv_conversations_free", "Conversations of a typical length the KV caches "
                                    "can still take.", value=free)
