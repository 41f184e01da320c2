"""OpenAI Realtime GA audio formats: `audio/pcm` (PCM16 LE, 24 kHz), `audio/pcmu` and `audio/pcma` (G.711, 8 kHz).

Input audio is decoded to float32 at the format's own rate and resampled to the model's 16 kHz; output audio comes
from the pipeline as 24 kHz float PCM and is encoded to the session's output format, optionally chunk by chunk
with `OutputEncoder`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from models.qwen3_omni.audio_features import float_to_g711, float_to_pcm16, g711_to_float, pcm16_to_float, resample

MODEL_RATE = 16000
OUTPUT_RATE = 24000
_RATES = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}
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
        """`{"type": "audio/pcm", "rate": 24000}`, `{"type": "audio/pcmu"}`, `{"type": "audio/pcma"}`; the beta
        names "pcm16", "g711_ulaw" and "g711_alaw" are accepted too."""
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

    def duration_ms(self, n_bytes: int) -> float:
        return n_bytes / self.bytes_per_sample * 1000.0 / self.rate


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


def to_model_rate(x: torch.Tensor, fmt: AudioFormat) -> torch.Tensor:
    """Decoded samples at the format's rate -> 16 kHz for the model."""
    return resample(x, fmt.rate, MODEL_RATE) if len(x) else x


def encode(pcm24k: np.ndarray | torch.Tensor, fmt: AudioFormat) -> bytes:
    """24 kHz float PCM from the pipeline -> bytes in `fmt` (one whole signal; see OutputEncoder for streaming)."""
    x = _tensor(pcm24k)
    if fmt.type == "audio/pcm" or not len(x):
        return float_to_pcm16(x)
    return float_to_g711(resample(x, OUTPUT_RATE, fmt.rate), _LAW[fmt.type])


class OutputEncoder:
    """Streaming `encode`: `push` chunks, then `flush` once; the bytes concatenate to `encode(whole signal)`.

    PCM16 is per sample, so it is exact with no delay. For G.711 the 24k -> 8k resampler's output sample j (at
    input time 3j) reads input samples 3j - h .. 3j + h (h = 103 for the 32-zero-crossing kernel). The encoder
    keeps `_CONTEXT` >= h samples of history, emits an output sample only once its whole right support has arrived
    (a hold-back of ~_CONTEXT / 24 ms) and, on flush, the rest with zeros beyond the end as the whole-signal
    resample does. Each emitted sample therefore sees exactly the inputs it would see in one-shot resampling:
    no chunk-edge clicks, and only float summation order could differ (tests/test_realtime_audio.py measures it:
    identical bytes for chunks of 1 to 2000 samples, where encoding the same chunks independently changes >100).
    """

    _CONTEXT = 120  # input samples kept either side; a multiple of the 3:1 ratio, >= the kernel half-width

    def __init__(self, fmt: AudioFormat) -> None:
        self.fmt = fmt
        self._ratio = OUTPUT_RATE // fmt.rate
        self.reset()

    def reset(self) -> None:
        self._buf = torch.zeros(self._CONTEXT)  # input samples from absolute time _start on (zeros before 0)
        self._start = -self._CONTEXT
        self._received = 0
        self._next = 0  # next output sample to emit

    def push(self, pcm24k: np.ndarray | torch.Tensor) -> bytes:
        x = _tensor(pcm24k)
        if self.fmt.type == "audio/pcm":
            return float_to_pcm16(x)
        self._buf = torch.cat([self._buf, x])
        self._received += len(x)
        ready = max(0, (self._received - 1 - self._CONTEXT) // self._ratio + 1)
        return self._emit(ready)

    def flush(self) -> bytes:
        """The held-back tail; the encoder is then ready for a new signal."""
        out = b"" if self.fmt.type == "audio/pcm" else self._emit(-(-self._received // self._ratio))
        self.reset()
        return out

    def _emit(self, end: int) -> bytes:
        if end <= self._next:
            return b""
        r, c = self._ratio, self._CONTEXT
        lo = r * self._next - c - self._start
        hi = min(self._received, r * (end - 1) + c + 1) - self._start
        y = resample(self._buf[lo:hi], OUTPUT_RATE, self.fmt.rate)[c // r : c // r + end - self._next]
        self._next = end
        keep = r * end - c - self._start
        self._buf, self._start = self._buf[keep:], self._start + keep
        return float_to_g711(y, _LAW[self.fmt.type])


class TimeStretch:
    """Streaming time-scale change without a pitch change (WSOLA), for `audio.output.speed`.

    Output frames of N = 40 ms are Hann-windowed and overlap-added every N/2; the k-th one is read from the
    input near k * N/2 * speed, shifted by up to +-10 ms to where it best continues the previous frame's
    natural continuation (the highest cross-correlation), so periods line up and the pitch is kept.
    `push` chunks of 24 kHz audio, then `flush` once: the output is about len(input) / speed samples, and
    it does not depend on how the input was chunked (each frame waits until all the input it reads exists).
    """

    N, DELTA = 960, 240  # frame and search tolerance, in samples at 24 kHz

    def __init__(self, speed: float) -> None:
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
