"""Server-side turn detection on the input audio: `server_vad` and `semantic_vad`, both driven by WebRTC's VAD.

Audio arrives as float32 at the model's input rate (resampled to 16 kHz if WebRTC does not read that rate) in
any chunk size and is judged in 30 ms frames (a remainder waits for the next push). Positions are integer ms of
input audio since `reset(origin_ms)` (0 at construction), so events fall on 30 ms frame boundaries.

- `threshold` (0..1) -> webrtcvad aggressiveness by quartiles: [0, .25) -> 0, [.25, .5) -> 1, [.5, .75) -> 2,
  [.75, 1] -> 3 (the default 0.5 -> 2). Higher means fewer frames count as speech, as OpenAI's threshold does.
- WebRTC's noise model starts untrained: it flags the first ~6 frames of even -80 dBFS noise as speech. The first
  `WARMUP_FRAMES` (300 ms) after construction only train it and count as unvoiced; `reset` keeps the trained model.
- Speech starts after a run of consecutive voiced frames, so clicks never open a turn. WebRTC extends every voiced
  frame by a hangover (3 frames at aggressiveness 0-1, 2 at 2-3); measured on clicks of 0.2-25 ms in noise, the
  longest voiced run was 6 frames at 0-1 and 4 at 2-3, so the run needed is 7 frames (210 ms) at 0-1 and 5
  (150 ms) at 2-3 (`min_speech_ms` overrides it). `SpeechStarted.audio_start_ms` is the first voiced frame of the
  run minus `prefix_padding_ms`, clamped at the origin.
- Speech stops once `silence_duration_ms` of consecutive unvoiced frames (rounded up to whole frames) follow it.
  As in OpenAI's protocol, `SpeechStopped.audio_end_ms` is that detection point, so it includes the silence;
  `speech_end_ms` is the end of the last voiced frame.
- `idle_timeout_ms` (server_vad only): `arm_idle(at_ms)` starts the timer, on the audio clock, e.g. when the
  last response finished playing; once that much audio passes with no speech, `push` (or `idle(now_ms)`) yields
  one `IdleTimeout(audio_start_ms, audio_end_ms)`. Speech disarms it.
- `semantic_vad` has no semantic model behind it here: it is served as server_vad with the defaults above and
  `silence_duration_ms` chosen by eagerness: low 1000, medium 500, auto 500, high 250.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import webrtcvad

from .pcm import float_to_pcm16, resample

WEBRTC_RATES = (8000, 16000, 32000, 48000)  # the rates WebRTC's VAD reads; others are resampled
FRAME_MS = 30
WARMUP_FRAMES = 10
_START_MS = (210, 210, 150, 150)  # by aggressiveness
EAGERNESS_SILENCE_MS = {"low": 1000, "medium": 500, "auto": 500, "high": 250}
_COMMON_KEYS = ("type", "create_response", "interrupt_response")
_SERVER_KEYS = (*_COMMON_KEYS, "threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms")
_SEMANTIC_KEYS = (*_COMMON_KEYS, "eagerness")


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
        ints = ("prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms", "min_speech_ms")
        for key in ints:
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
        unknown = set(cfg) - set(_SEMANTIC_KEYS if kind == "semantic_vad" else _SERVER_KEYS)
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
        keys = _SEMANTIC_KEYS if self.type == "semantic_vad" else _SERVER_KEYS
        return {k: getattr(self, k) for k in keys}

    @property
    def aggressiveness(self) -> int:
        return min(3, int(self.threshold * 4))


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


VadEvent = SpeechStarted | SpeechStopped | IdleTimeout


class ServerVad:
    """Per-session turn detector; `push` audio, act on the events, `reset` when the input buffer starts over."""

    def __init__(self, cfg: VadConfig, rate: int) -> None:
        """`rate`: of the audio pushed (the model's input rate)."""
        self.cfg, self.rate = cfg, rate
        self._vad_rate = rate if rate in WEBRTC_RATES else WEBRTC_RATES[1]
        self._frame_bytes = self._vad_rate * FRAME_MS // 1000 * 2
        self._vad = webrtcvad.Vad(cfg.aggressiveness)
        min_ms = cfg.min_speech_ms or _START_MS[cfg.aggressiveness]
        self._start_frames = math.ceil(min_ms / FRAME_MS)
        self._stop_frames = math.ceil(cfg.silence_duration_ms / FRAME_MS)
        self._warmup = WARMUP_FRAMES
        self.reset()

    def reset(self, origin_ms: int = 0) -> None:
        self._pending = b""
        self._origin = origin_ms
        self._frames = 0  # frames judged since the origin
        self._speaking = False
        self._run = 0  # consecutive voiced frames (before speech) or unvoiced frames (during speech)
        self._last_voiced_end = origin_ms
        self._idle_since: int | None = None

    @property
    def position_ms(self) -> int:
        """End of the last judged frame."""
        return self._origin + self._frames * FRAME_MS

    def push(self, audio: np.ndarray | torch.Tensor) -> list[VadEvent]:
        x = audio if isinstance(audio, torch.Tensor) else torch.from_numpy(np.array(audio, np.float32))
        data = self._pending + float_to_pcm16(resample(x.reshape(-1), self.rate, self._vad_rate))
        size = self._frame_bytes
        n = len(data) // size * size
        self._pending = data[n:]
        events: list[VadEvent] = []
        for i in range(0, n, size):
            voiced = self._vad.is_speech(data[i : i + size], self._vad_rate)
            if self._warmup:
                self._warmup, voiced = self._warmup - 1, False
            event = self._frame(voiced)
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

    def _frame(self, voiced: bool) -> VadEvent | None:
        self._frames += 1
        end = self.position_ms
        if not self._speaking:
            self._run = self._run + 1 if voiced else 0
            if self._run < self._start_frames:
                return None
            self._speaking, self._run, self._idle_since = True, 0, None
            self._last_voiced_end = end
            onset = end - self._start_frames * FRAME_MS
            return SpeechStarted(max(self._origin, onset - self.cfg.prefix_padding_ms))
        if voiced:
            self._run, self._last_voiced_end = 0, end
            return None
        self._run += 1
        if self._run < self._stop_frames:
            return None
        self._speaking, self._run = False, 0
        return SpeechStopped(end, self._last_voiced_end)
