"""The GA audio formats (`audio/pcm`: PCM16 24 kHz; `audio/pcmu`, `audio/pcma`: G.711 8 kHz) and the audio streams."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from pipelines.types import AudioAhead

from .pcm import StreamResampler, float_to_g711, float_to_pcm16, g711_to_float, pcm16_to_float, resample

log = logging.getLogger(__name__)

_RATES = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}  # the wire formats' rates (the protocol's)
_LAW: dict[str, Literal["ulaw", "alaw"]] = {"audio/pcmu": "ulaw", "audio/pcma": "alaw"}
_LEGACY = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}  # beta protocol names


@dataclass(frozen=True)
class AudioFormat:
    type: str = "audio/pcm"
    rate: int = 24000

    def __post_init__(self) -> None:
        if self.type not in _RATES:
            raise ValueError(f"unsupported audio format type {self.type!r}; expected one of {sorted(_RATES)}")
        if self.rate != _RATES[self.type]:
            raise ValueError(f"{self.type} supports only rate {_RATES[self.type]}, got {self.rate!r}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | str) -> AudioFormat:
        """A GA format object (`{"type": "audio/pcm", "rate": 24000}`), or a beta name ("pcm16", "g711_ulaw", ...)."""
        if isinstance(cfg, str):
            if cfg not in _LEGACY:
                raise ValueError(f"unsupported audio format {cfg!r}; expected one of {sorted(_LEGACY)}")
            return cls(_LEGACY[cfg], _RATES[_LEGACY[cfg]])
        if not isinstance(cfg, Mapping):
            raise ValueError(f"audio format must be an object like {{'type': 'audio/pcm'}}, got {cfg!r}")
        unknown = set(cfg) - {"type", "rate"}
        if unknown:
            raise ValueError(f"unknown audio format field(s) {sorted(unknown)}")
        kind = cfg.get("type", "audio/pcm")
        if not isinstance(kind, str) or kind not in _RATES:
            raise ValueError(f"unsupported audio format type {kind!r}; expected one of {sorted(_RATES)}")
        rate = cfg.get("rate")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)):
            raise ValueError(f"rate must be an integer, got {rate!r}")
        return cls(kind, _RATES[kind] if rate is None else rate)

    def to_config(self) -> dict[str, Any]:
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.type == "audio/pcm" else 1


def _tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().float().reshape(-1)
    return torch.from_numpy(np.array(x, dtype=np.float32).reshape(-1))


def decode(data: bytes, fmt: AudioFormat) -> torch.Tensor:
    """Encoded bytes -> float32 mono samples at the format's own rate."""
    if fmt.type == "audio/pcm":
        if len(data) % 2:
            raise ValueError(f"audio/pcm needs whole 16-bit samples; got an odd byte count ({len(data)})")
        return pcm16_to_float(data)
    return g711_to_float(data, _LAW[fmt.type])


def to_model_rate(x: torch.Tensor, fmt: AudioFormat, rate: int) -> torch.Tensor:
    return resample(x, fmt.rate, rate) if len(x) else x


def _codec(x: torch.Tensor, fmt: AudioFormat) -> bytes:
    return float_to_pcm16(x) if fmt.type == "audio/pcm" else float_to_g711(x, _LAW[fmt.type])


def encode(pcm: np.ndarray | torch.Tensor, fmt: AudioFormat, rate: int) -> bytes:
    """Float PCM at `rate` (the model's output rate) -> bytes in `fmt` (one whole signal; see OutputEncoder)."""
    x = _tensor(pcm)
    return _codec(resample(x, rate, fmt.rate) if len(x) else x, fmt)


class OutputEncoder:
    """Streaming `encode`: `push` chunks, then `flush` once; the bytes concatenate to `encode(whole signal)` (no
    chunk-edge clicks: tests/test_realtime_audio.py gives identical bytes for chunks of 1 to 2000 samples)."""

    def __init__(self, fmt: AudioFormat, rate: int) -> None:
        self.fmt, self.rate = fmt, rate
        self._resampler = StreamResampler(rate, fmt.rate)

    def push(self, pcm: np.ndarray | torch.Tensor) -> bytes:
        y = self._resampler.push(_tensor(pcm))
        return _codec(y, self.fmt) if len(y) else b""

    def flush(self) -> bytes:
        """The held-back tail; the encoder is then ready for a new signal."""
        y = self._resampler.tail()
        self._resampler.reset()
        return _codec(y, self.fmt) if len(y) else b""


class InputStream:
    """One input buffer resampled to the model's `rate` as it arrives (`to_model_rate` streamed) and the model's
    encoding of it (`ahead`: Pipeline.audio_ahead(), or None). Appends are gathered on the session's thread (`collect`,
    `rest`), resampled and encoded BATCH_S at a time on the audio worker (`encode`, `take`): a job per 20 ms append
    could not keep up with 64 talking sessions (commits waited 15 s, and the jobs held the GIL the engine needs)."""

    BATCH_S = 0.5
    EAGER_S = 0.1  # while the audio workers are idle, handed on once this much has gathered (0: only BATCH_S)

    def __init__(self, fmt: AudioFormat, rate: int, ahead: AudioAhead | None) -> None:
        self.fmt, self.ahead = fmt, ahead
        self._resampler = StreamResampler(fmt.rate, rate)
        self._pieces: list[torch.Tensor] = []
        self._waiting: list[torch.Tensor] = []  # collected, not yet handed to `encode`
        self._waiting_n = 0
        self._batch = int(fmt.rate * self.BATCH_S)

    def collect(self, pcm: torch.Tensor, idle: bool = False) -> torch.Tensor | None:
        """Gather an append; all that gathered, for `encode`, from BATCH_S (EAGER_S while the workers are `idle`)."""
        self._waiting.append(pcm)
        self._waiting_n += pcm.shape[0]
        eager = idle and self.EAGER_S > 0 and self._waiting_n >= self.EAGER_S * self.fmt.rate
        return self.rest() if eager or self._waiting_n >= self._batch else None

    def rest(self) -> torch.Tensor | None:
        """What `collect` gathered and has not handed on (None: nothing)."""
        if not self._waiting:
            return None
        pcm = torch.cat(self._waiting) if len(self._waiting) > 1 else self._waiting[0]
        self._waiting, self._waiting_n = [], 0
        return pcm

    def encode(self, pcm: torch.Tensor) -> None:
        self._pieces.append(self._resampler.push(pcm))
        self.ahead = _feed(self.ahead, self._pieces[-1])

    def take(self, last: bool, rest: torch.Tensor | None = None) -> tuple[torch.Tensor, AudioAhead | None]:
        """The buffer (`rest` encoded first) at the model rate, its encoding (`last`: handed over, else a fork)."""
        if rest is not None:
            self.encode(rest)
        tail = self._resampler.tail()
        return torch.cat([*self._pieces, tail]), _feed(self.ahead, tail, fork=not last, seal=True)


def _feed(ahead: AudioAhead | None, x: torch.Tensor, fork: bool = False, seal: bool = False) -> AudioAhead | None:
    """`ahead` (or a fork) with `x` pushed and sealed; None if that failed (the turn then encodes its whole audio)."""
    if ahead is None:
        return None
    try:
        ahead = ahead.fork() if fork else ahead
        if len(x):
            ahead.push(x)
        if seal:
            ahead.seal()
        return ahead
    except Exception:
        log.exception("encoding audio ahead failed; the turn encodes its whole audio")
        return None


class TimeStretch:
    """Streaming time-scale change without a pitch change (WSOLA), for `audio.output.speed`: 40 ms Hann frames
    overlap-added every 20 ms, the k-th read near k * 20 ms * speed, shifted by up to +-10 ms to where it best
    continues the previous one. `push`, then `flush` once: about len(input) / speed samples, whatever the chunking."""

    FRAME_MS, DELTA_MS = 40, 10  # frame and search tolerance

    def __init__(self, speed: float, rate: int) -> None:
        self.N, self.DELTA = rate * self.FRAME_MS // 1000 // 2 * 2, rate * self.DELTA_MS // 1000
        self.speed, self.hop = speed, self.N // 2
        self._window = torch.hann_window(self.N, periodic=True)
        self._buf, self._base = torch.zeros(self.DELTA), -self.DELTA  # input from absolute sample _base on
        self._received = self._emitted = self._k = 0
        self._prev = 0  # absolute start of the last frame read
        self._ola = torch.zeros(self.N)

    def push(self, pcm24k: np.ndarray | torch.Tensor) -> np.ndarray:
        x = _tensor(pcm24k)
        self._buf, self._received = torch.cat([self._buf, x]), self._received + len(x)
        return self._run(self._received)

    def flush(self) -> np.ndarray:
        total = round(self._received / self.speed)
        self._buf = torch.cat([self._buf, torch.zeros(2 * self.N + 2 * self.DELTA + int(self.hop * self.speed))])
        out = self._run(self._base + len(self._buf))
        return np.concatenate([out, self._ola.numpy()])[: max(0, total - (self._emitted - len(out)))]

    def _run(self, available: int) -> np.ndarray:
        out = []
        while True:
            nominal = round(self._k * self.hop * self.speed)
            lo = max(0, nominal - self.DELTA) if self._k else 0
            hi = nominal + self.DELTA if self._k else 0
            if max(hi, self._prev + self.hop) + self.N > available:
                break
            if self._k:
                template = self._slice(self._prev + self.hop, self.N)
                region = self._slice(lo, hi - lo + self.N)
                score = torch.nn.functional.conv1d(region[None, None], template[None, None])[0, 0]
                start = lo + int(torch.argmax(score))
            else:
                start = 0
            self._ola += self._window * self._slice(start, self.N)
            out.append(self._ola[: self.hop].clone())
            self._ola = torch.cat([self._ola[self.hop :], torch.zeros(self.hop)])
            self._prev, self._k = start, self._k + 1
            keep = min(self._prev, round(self._k * self.hop * self.speed) - self.DELTA) - self._base
            if keep > 0:
                self._buf, self._base = self._buf[keep:], self._base + keep
        self._emitted += sum(len(o) for o in out)
        return torch.cat(out).numpy() if out else np.zeros(0, np.float32)

    def _slice(self, start: int, n: int) -> torch.Tensor:
        return self._buf[start - self._base : start - self._base + n]
