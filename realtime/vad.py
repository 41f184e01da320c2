"""Turn detection: `server_vad` on Silero VAD, `semantic_vad` adding Smart Turn v3.2 (README "Turn detection").

Audio is judged in 32 ms frames at 16 kHz (a remainder waits for the next push); positions are integer ms of input
audio since `reset(origin_ms)`. As in OpenAI's protocol, `SpeechStopped.audio_end_ms` is the detection point (with the
silence), `speech_end_ms` the end of the last speech frame. The idle timer runs on the audio clock from `arm_idle`."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .pcm import resample
from .silero import FRAME, FRAME_MS, RATE, SileroStream
from .smart_turn import WINDOW, SmartTurn
from .turn_presets import EAGERNESS, Eagerness

log = logging.getLogger(__name__)
MIN_SPEECH_MS = 96
HYSTERESIS = 0.15
EAGERNESS_SILENCE_MS = {"low": 1000, "medium": 500, "auto": 500, "high": 250}  # the fallback without Smart Turn
SERVER_VAD_DEFAULTS = {
    "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
    "idle_timeout_ms": None, "create_response": True, "interrupt_response": True,
}
SEMANTIC_VAD_DEFAULTS = {"type": "semantic_vad", "eagerness": "auto", "create_response": True,
                         "interrupt_response": True}


@dataclass(frozen=True)
class VadConfig:
    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    idle_timeout_ms: int | None = None
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str | None = None  # semantic_vad only
    min_speech_ms: int | None = None  # not in the protocol: voiced run needed to start speech (None: by mode)

    def __post_init__(self) -> None:
        for key in ("prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms", "min_speech_ms"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v > 3_600_000):
                raise ValueError(f"{key} must be an integer number of ms (at most an hour), got {v!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float):
            raise ValueError(f"invalid {self.type} threshold {self.threshold!r}: must be a number")
        for key in ("create_response", "interrupt_response"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.type not in ("server_vad", "semantic_vad"):
            raise ValueError(f"unsupported turn_detection type {self.type!r}; expected server_vad or semantic_vad")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be within [0, 1], got {self.threshold}")
        if self.prefix_padding_ms < 0 or self.silence_duration_ms <= 0 or (self.min_speech_ms or 1) <= 0:
            raise ValueError("prefix_padding_ms must be >= 0; silence_duration_ms and min_speech_ms > 0")
        if self.idle_timeout_ms is not None and self.idle_timeout_ms <= 0:
            raise ValueError(f"idle_timeout_ms must be positive, got {self.idle_timeout_ms}")
        if self.type == "semantic_vad" and self.eagerness not in EAGERNESS_SILENCE_MS:
            raise ValueError(f"eagerness must be one of {sorted(EAGERNESS_SILENCE_MS)}, got {self.eagerness!r}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> VadConfig:
        """A GA `turn_detection` object (not null: no turn detection means no VAD at all)."""
        kind = cfg.get("type")
        if not isinstance(kind, str) or kind not in ("server_vad", "semantic_vad"):
            raise ValueError(f"unsupported turn_detection type {kind!r}; expected server_vad or semantic_vad")
        unknown = set(cfg) - set(SEMANTIC_VAD_DEFAULTS if kind == "semantic_vad" else SERVER_VAD_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown {kind} field(s) {sorted(unknown)}")
        args = {k: v for k, v in cfg.items() if v is not None}
        if kind == "semantic_vad":
            args.setdefault("eagerness", "auto")
            if not isinstance(args["eagerness"], str) or args["eagerness"] not in EAGERNESS_SILENCE_MS:
                raise ValueError(f"eagerness must be one of {sorted(EAGERNESS_SILENCE_MS)}, got {args['eagerness']!r}")
            args["silence_duration_ms"] = EAGERNESS_SILENCE_MS[args["eagerness"]]
        try:
            return cls(**args)
        except TypeError as e:  # e.g. a string where a number belongs
            raise ValueError(f"invalid {kind} config {dict(cfg)}: {e}") from None

    def to_config(self) -> dict[str, Any]:
        keys = SEMANTIC_VAD_DEFAULTS if self.type == "semantic_vad" else SERVER_VAD_DEFAULTS
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int
    speech_end_ms: int


@dataclass(frozen=True)
class IdleTimeout:
    audio_start_ms: int
    audio_end_ms: int


@dataclass(frozen=True)
class EndLikely:
    """The first sign, in a pause after speech, that the user may have finished (at most one per pause)."""

    audio_end_ms: int


@dataclass(frozen=True)
class EndWithdrawn:
    """Speech resumed after an EndLikely, before the turn ended."""

    at_ms: int


VadEvent = SpeechStarted | SpeechStopped | IdleTimeout | EndLikely | EndWithdrawn
LIKELY_END_MS = 160  # the longest pause before a likely end (the candidate pause of SGLang-Omni's presets)


class ServerVad:
    """Per-session turn detector; `push` audio, act on the events, `reset` when the input buffer starts over."""

    def __init__(self, cfg: VadConfig, rate: int, early: bool = False) -> None:
        """`rate`: of the audio pushed (the model's input rate); `early`: also yield EndLikely / EndWithdrawn."""
        self.cfg, self.rate, self.early = cfg, rate, early
        self._silero = SileroStream()
        self._on, self._off = cfg.threshold, max(cfg.threshold - HYSTERESIS, 0.01)
        self._start_frames = math.ceil((cfg.min_speech_ms or MIN_SPEECH_MS) / FRAME_MS)
        self._stop_frames = math.ceil(cfg.silence_duration_ms / FRAME_MS)
        self._turn: SmartTurn | None = None
        self.eagerness: Eagerness | None = None
        if cfg.type == "semantic_vad":
            try:
                self._turn, self.eagerness = SmartTurn(), EAGERNESS[cfg.eagerness or "auto"]
            except FileNotFoundError as e:
                log.warning("semantic_vad served as server_vad (silence %d ms): %s", cfg.silence_duration_ms, e)
        self.reset()

    @property
    def semantic(self) -> bool:
        """True when Smart Turn judges the pauses (semantic_vad with its model file)."""
        return self._turn is not None

    def reset(self, origin_ms: int = 0) -> None:
        self._pending = np.zeros(0, np.float32)
        self._recent: deque[np.ndarray] = deque(maxlen=WINDOW // FRAME)  # the last 8 s, for Smart Turn
        self._origin = origin_ms
        self._frames = 0  # frames judged since the origin
        self._speaking = False
        self._run = 0  # consecutive speech frames (before speech) or silence frames (during speech)
        self._turn_frames = 0  # frames since the turn's speech began (with its padding)
        self._likely = False  # EndLikely was sent in this pause
        self._last_voiced_end = origin_ms
        self._idle_since: int | None = None
        self._silero.reset()

    @property
    def position_ms(self) -> int:
        """End of the last judged frame."""
        return self._origin + self._frames * FRAME_MS

    def push(self, audio: np.ndarray | torch.Tensor) -> list[VadEvent]:
        x = audio if isinstance(audio, torch.Tensor) else torch.from_numpy(np.array(audio, np.float32))
        data = np.concatenate([self._pending, resample(x.reshape(-1).float(), self.rate, RATE).numpy()])
        n = len(data) // FRAME * FRAME
        self._pending = data[n:].copy()
        events: list[VadEvent] = []
        for i in range(0, n, FRAME):
            frame = data[i : i + FRAME]
            self._recent.append(frame)
            event = self._frame(self._silero.frame(frame))
            timeout = self.idle(self.position_ms)
            events += [e for e in (event, timeout) if e is not None]
        return events

    def arm_idle(self, at_ms: int) -> None:
        """Start the idle timer (no-op without idle_timeout_ms): e.g. when the last response finished playing."""
        if self.cfg.idle_timeout_ms is not None:
            self._idle_since = at_ms

    def idle(self, now_ms: int) -> IdleTimeout | None:
        """The timeout once `idle_timeout_ms` has passed since `arm_idle` with no speech; it then disarms."""
        since, limit = self._idle_since, self.cfg.idle_timeout_ms
        if since is None or limit is None or self._speaking or now_ms - since < limit:
            return None
        self._idle_since = None
        return IdleTimeout(since, now_ms)

    def _frame(self, prob: float) -> VadEvent | None:
        self._frames += 1
        self._turn_frames += 1
        end = self.position_ms
        if not self._speaking:
            self._run = self._run + 1 if prob >= self._on else 0
            if self._run < self._start_frames:
                return None
            self._speaking, self._run, self._idle_since = True, 0, None
            self._last_voiced_end = end
            onset = end - self._start_frames * FRAME_MS
            start = max(self._origin, onset - self.cfg.prefix_padding_ms)
            self._turn_frames = (end - start) // FRAME_MS
            return SpeechStarted(start)
        if prob >= self._off:
            self._run, self._last_voiced_end = 0, end
            if self._likely:
                self._likely = False
                return EndWithdrawn(end)
            return None
        self._run += 1
        if not self._turn_ends():
            if self.early and not self._likely and self._run * FRAME_MS >= self._likely_ms:
                self._likely = True
                return EndLikely(end)
            return None
        self._speaking, self._run, self._likely = False, 0, False
        return SpeechStopped(end, self._last_voiced_end)

    @property
    def _likely_ms(self) -> int:
        """Pause after which the end is likely: two frames before the first decision (Smart Turn's first look,
        or the end of the silence window), so that a held reply has a head start; at most LIKELY_END_MS."""
        decide = self.eagerness.candidate_ms if self.semantic and self.eagerness else self.cfg.silence_duration_ms
        return max(FRAME_MS, min(LIKELY_END_MS, decide - 2 * FRAME_MS))

    def _turn_ends(self) -> bool:
        if self._turn is None or self.eagerness is None:
            return self._run >= self._stop_frames
        e, pause_ms = self.eagerness, self._run * FRAME_MS
        if pause_ms >= e.max_silence_ms:
            return True
        candidate_frames = math.ceil(e.candidate_ms / FRAME_MS)
        if self._run % candidate_frames or self._run // candidate_frames > e.asks:
            return False
        turn = list(self._recent)[-min(self._turn_frames, len(self._recent)) :]
        return self._turn.complete(np.concatenate(turn)) >= e.confidence
