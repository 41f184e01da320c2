"""Scheduler: picks what one stage runs next, and keeps its KV cache honest.

A work is a sequence with a history of inputs, the first `kv.length(key)` of them cached; a step feeds the rest
(`pending()`): many is a prefill, one a decode, and an evicted or preempted sequence is recomputed.

A new turn's prefill stands between a listener and their first audio, so prefills go first, within a token budget,
unless a stream of this stage still ahead of real time is about to run dry (under URGENT_S buffered); one already behind
is not helped by starving new turns. Another stage's prefill does not take this stage's step, only lengthens the
engine's round, so it does not wait (a rule across stages held every new turn back while any of 64 streams was near dry:
15 s to first audio on the H200). A stage whose launch decodes the streams right after a prefill
(StageConfig.decode_after_prefill) costs them only the prefill's time, so its gate is off (`urgent_s` 0). Decodes run
most urgent first. Held works are scheduled apart and never take KV blocks from committed work."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Protocol

from .kv_cache import OutOfBlocks, PagedKVCache

log = logging.getLogger(__name__)
URGENT_S = 0.25  # a stream with less audio buffered than this is served before new prefills


class Work(Protocol):
    key: str  # KV sequence id (a session's conversation, or one turn's stream in a later stage)
    keep_kv: bool  # the cache outlives the work (a session's conversation between turns)
    held: bool  # its turn is held back: it runs only when no committed work is ready

    def pending(self) -> int:
        """Inputs known but not yet in the cache (0: nothing to run now)."""

    def urgency(self) -> float:
        """Seconds of audio the listener has left (negative: behind real time, or waiting that long for
        the first audio); smaller runs sooner. Text-only work: infinity."""

    def fail(self, code: str, message: str) -> None: ...


@dataclass
class Batch:
    works: list[Work]
    lengths: list[int]  # inputs fed per row this step
    prefill: bool


class Scheduler:
    def __init__(self, kv: PagedKVCache | None, max_batch: int = 32, max_prefill_tokens: int = 8192) -> None:
        self.kv = kv
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.urgent_s = URGENT_S
        self.works: list[Work] = []
        self.evictions = 0  # idle caches dropped to make room
        self.preemptions = 0  # running works whose cache was dropped (recomputed later)

    def add(self, work: Work) -> None:
        self.works.append(work)

    def remove(self, work: Work) -> None:
        if work in self.works:
            self.works.remove(work)
        if self.kv is not None and not work.keep_kv:
            self.kv.release(work.key)

    def schedule(self, held: bool = False, ahead_s: float = 0.0, prefills: bool = True) -> Batch | None:
        """The next batch of held or of committed works (`prefills` False: decodes only). `ahead_s` (0: off): a
        stream with more than that buffered does not decode (its playback catches up; others get the rows)."""
        ready = [(w, n) for w in list(self.works) if w.held == held and (n := self._pending(w)) > 0]
        ready = [(w, n) for w, n in ready if w in self.works]  # a failed turn's other works left just now
        if ahead_s > 0:
            ready = [(w, n) for w, n in ready if not (n == 1 and ahead_s < w.urgency() < math.inf)]
        if not ready:
            return None
        decodes = sorted(((w, n) for w, n in ready if n == 1 and self._cached(w)), key=lambda x: x[0].urgency())
        waiting = sorted(((w, n) for w, n in ready if prefills and not (n == 1 and self._cached(w))),
                         key=lambda x: x[0].urgency())
        urgent = any(0 <= w.urgency() < self.urgent_s for w, _ in decodes)
        if waiting and not urgent:
            batch = self._admit_prefills(waiting)
            if batch is not None:
                return batch
        if decodes:
            return self._admit_decodes(decodes)
        return None

    def _pending(self, w: Work) -> int:
        """w.pending(); a work that raises there fails alone (its turn ends) and leaves the scheduler."""
        try:
            return w.pending()
        except Exception as e:
            log.exception("work %s failed", w.key)
            w.fail("internal_error", f"{w.key}: {type(e).__name__}: {e}")
            self.remove(w)
            return 0

    def _cached(self, w: Work) -> bool:
        return self.kv is None or self.kv.length(w.key) > 0

    def _admit_prefills(self, prefills: list[tuple[Work, int]]) -> Batch | None:
        chosen: list[tuple[Work, int]] = []
        budget = self.max_prefill_tokens
        for w, n in prefills:
            if chosen and (n > budget or len(chosen) >= self.max_batch):
                break
            if not self._reserve(w, n, {x.key for x, _ in chosen}):
                continue
            chosen.append((w, n))
            budget -= n
        if not chosen:
            return None
        return Batch([w for w, _ in chosen], [n for _, n in chosen], prefill=True)

    def _admit_decodes(self, decodes: list[tuple[Work, int]]) -> Batch | None:
        chosen: list[Work] = []
        for w, n in decodes[: self.max_batch]:
            if self.kv is not None and self.kv.length(w.key) == 0:
                continue  # preempted while this batch was being formed: it re-prefills next step
            if self._reserve(w, n, {x.key for x in chosen}):
                chosen.append(w)
        if not chosen:
            return None
        return Batch(chosen, [1] * len(chosen), prefill=False)

    def _reserve(self, w: Work, n: int, protected: set[str]) -> bool:
        """Room for n more tokens of w (evicting, preempting); one that cannot fit an empty cache fails."""
        kv = self.kv
        if kv is None:
            return True
        total = kv.length(w.key) + n
        if kv.layout.blocks_for(total) > kv.layout.num_blocks:
            size = kv.layout.num_blocks * kv.layout.block_size
            w.fail("context_too_long", f"{total} tokens can never fit in the KV cache ({size} slots)")
            self.remove(w)
            return False
        while True:
            try:
                kv.reserve(w.key, n)
                return True
            except OutOfBlocks:
                if not self._make_room(w, protected):
                    return False

    def _make_room(self, w: Work, protected: set[str]) -> bool:
        """Free blocks for w: the least recently used idle cache, else the newest running work that is
        no more urgent than w and not already in the batch being formed."""
        active = {x.key for x in self.works}
        idle = self.kv.lru(exclude=active)
        if idle and not w.held:
            self.kv.release(idle[0])
            self.evictions += 1
            return True
        victims = [x for x in self.works if x is not w and x.key not in protected and self.kv.length(x.key) > 0
                   and x.urgency() >= w.urgency() and (x.held or not w.held)]
        if not victims:
            return False
        held = [x for x in victims if x.held]
        victim = (held or victims)[-1]  # held work first; the newest of the least urgent: the oldest streams go on
        self.kv.release(victim.key)  # recomputed from its history when it runs again
        self.preemptions += 1
        return True
