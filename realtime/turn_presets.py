"""semantic_vad's eagerness presets; why they sit where they do: README "Turn detection" (bench_turns.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Eagerness:
    candidate_ms: int  # pause before Smart Turn is first asked, and between later asks
    asks: int  # how many times it is asked in one pause (each call costs ~10-100 ms of CPU, more on a busy one)
    confidence: float  # P(complete) that ends the turn at once
    max_silence_ms: int  # the turn ends after this much pause, whatever Smart Turn says


EAGERNESS = {
    "high": Eagerness(candidate_ms=160, asks=2, confidence=0.6, max_silence_ms=600),
    "medium": Eagerness(candidate_ms=192, asks=2, confidence=0.85, max_silence_ms=1000),
    "auto": Eagerness(candidate_ms=192, asks=2, confidence=0.85, max_silence_ms=1000),
    "low": Eagerness(candidate_ms=320, asks=2, confidence=0.95, max_silence_ms=2000),
}
