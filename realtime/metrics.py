"""Prometheus text metrics: sessions, time to first audio, real-time factor, errors."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

TTFA_BUCKETS_S = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass
class Metrics:
    sessions: int = 0
    sessions_total: int = 0
    rejected_total: int = 0
    responses_total: int = 0
    ttfa_counts: list[int] = field(default_factory=lambda: [0] * (len(TTFA_BUCKETS_S) + 1))
    ttfa_sum: float = 0.0
    rtf_last: float = 0.0
    rtf_sum: float = 0.0
    rtf_count: int = 0
    errors: Counter = field(default_factory=Counter)

    def first_audio(self, seconds: float) -> None:
        self.responses_total += 1
        self.ttfa_sum += seconds
        for i, bound in enumerate(TTFA_BUCKETS_S):
            if seconds <= bound:
                self.ttfa_counts[i] += 1
                return
        self.ttfa_counts[-1] += 1

    def rtf(self, value: float) -> None:
        self.rtf_last, self.rtf_sum, self.rtf_count = value, self.rtf_sum + value, self.rtf_count + 1

    def error(self, code: str) -> None:
        self.errors[code] += 1

    def render(self) -> str:
        lines = [
            "# HELP omni_sessions Open realtime sessions.", "# TYPE omni_sessions gauge",
            f"omni_sessions {self.sessions}",
            "# TYPE omni_sessions_total counter", f"omni_sessions_total {self.sessions_total}",
            "# TYPE omni_sessions_rejected_total counter", f"omni_sessions_rejected_total {self.rejected_total}",
            "# HELP omni_time_to_first_audio_seconds From commit (or response.create) to the first audio delta.",
            "# TYPE omni_time_to_first_audio_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip((*TTFA_BUCKETS_S, float("inf")), self.ttfa_counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else f"{bound}"
            lines.append(f'omni_time_to_first_audio_seconds_bucket{{le="{le}"}} {cumulative}')
        lines += [f"omni_time_to_first_audio_seconds_sum {self.ttfa_sum}",
                  f"omni_time_to_first_audio_seconds_count {cumulative}",
                  "# HELP omni_rtf Real-time factor of responses (generation time / audio time).",
                  "# TYPE omni_rtf_last gauge", f"omni_rtf_last {self.rtf_last}",
                  "# TYPE omni_rtf summary", f"omni_rtf_sum {self.rtf_sum}", f"omni_rtf_count {self.rtf_count}",
                  "# TYPE omni_errors_total counter"]
        lines += [f'omni_errors_total{{code="{code}"}} {n}' for code, n in sorted(self.errors.items())]
        return "\n".join(lines) + "\n"
