"""Audio front end: PCM16 and G.711 codecs, resampling to 16 kHz, Whisper log-mel features, audio token count."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
N_MELS = 128

_ULAW_SEG_END = (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF)
_ALAW_SEG_END = (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)


def pcm16_to_float(data: bytes) -> torch.Tensor:
    """Little-endian int16 PCM bytes -> float32 samples in [-1, 1)."""
    return torch.from_numpy(np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0)


def float_to_int16(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x.detach().float() * 32768.0).clamp(-32768, 32767).to(torch.int16)


def float_to_pcm16(x: torch.Tensor) -> bytes:
    """Float samples -> little-endian int16 PCM bytes (x * 32768, rounded and clipped); exact inverse of the decode."""
    return float_to_int16(x).cpu().numpy().astype("<i2").tobytes()


def _segment(magnitude: torch.Tensor, seg_end: tuple[int, ...]) -> torch.Tensor:
    return (magnitude[..., None] > torch.tensor(seg_end, device=magnitude.device)).sum(-1)


def ulaw_encode(x: torch.Tensor) -> torch.Tensor:
    """int16 samples -> G.711 mu-law codes (uint8), bit-exact with the Sun g711.c / audioop.lin2ulaw."""
    v = x.to(torch.int32) >> 2
    mask = torch.where(v < 0, 0x7F, 0xFF)
    mag = v.abs().clamp(max=8159) + 0x21
    seg = _segment(mag, _ULAW_SEG_END)
    code = torch.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0xF))
    return (code ^ mask).to(torch.uint8)


def ulaw_decode(codes: torch.Tensor) -> torch.Tensor:
    """G.711 mu-law codes -> int16 samples (range +-32124)."""
    u = ~codes.to(torch.int32) & 0xFF
    t = (((u & 0xF) << 3) + 0x84) << ((u & 0x70) >> 4)
    return torch.where(u & 0x80 != 0, 0x84 - t, t - 0x84).to(torch.int16)


def alaw_encode(x: torch.Tensor) -> torch.Tensor:
    """int16 samples -> G.711 A-law codes (uint8), bit-exact with the Sun g711.c / audioop.lin2alaw."""
    v = x.to(torch.int32) >> 3
    mask = torch.where(v < 0, 0x55, 0xD5)
    mag = torch.where(v < 0, -v - 1, v)
    seg = _segment(mag, _ALAW_SEG_END)
    code = torch.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> seg.clamp(min=1)) & 0xF))
    return (code ^ mask).to(torch.uint8)


def alaw_decode(codes: torch.Tensor) -> torch.Tensor:
    """G.711 A-law codes -> int16 samples (range +-32256)."""
    a = codes.to(torch.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (((a & 0xF) << 4) + torch.where(seg == 0, 8, 0x108)) << (seg - 1).clamp(min=0)
    return torch.where(a & 0x80 != 0, t, -t).to(torch.int16)


def g711_to_float(data: bytes, law: Literal["ulaw", "alaw"]) -> torch.Tensor:
    """G.711 bytes (`audio/pcmu` = ulaw, `audio/pcma` = alaw, 8 kHz) -> float32 samples in [-1, 1)."""
    codes = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
    samples = ulaw_decode(codes) if law == "ulaw" else alaw_decode(codes)
    return samples.float() / 32768.0


def float_to_g711(x: torch.Tensor, law: Literal["ulaw", "alaw"]) -> bytes:
    samples = float_to_int16(x)
    codes = ulaw_encode(samples) if law == "ulaw" else alaw_encode(samples)
    return codes.cpu().numpy().tobytes()


def _exact_dtype(device: torch.device) -> torch.dtype:
    """float32 on CPU; float64 on CUDA, where float32 convolutions would run in TF32 (cudnn.allow_tf32 is on)."""
    return torch.float64 if device.type == "cuda" else torch.float32


def _kaiser(x: torch.Tensor, half: int, beta: float) -> torch.Tensor:
    inside = (1 - (x / half) ** 2).clamp(min=0).sqrt()
    return torch.where(x.abs() <= half, torch.special.i0(beta * inside) / float(np.i0(beta)), 0.0)


@lru_cache(maxsize=32)
def _sinc_kernel(orig: int, new: int, device: torch.device) -> tuple[torch.Tensor, int]:
    zeros, rolloff, beta = 32, 0.94, 12.0
    cutoff = min(1.0, new / orig) * rolloff
    half = math.ceil(zeros / cutoff)
    offsets = torch.arange(new, dtype=torch.float64)[:, None] * orig / new
    x = torch.arange(-half, half + orig, dtype=torch.float64)[None] - offsets
    taps = cutoff * torch.sinc(cutoff * x) * _kaiser(x, half, beta)
    taps = taps / taps.sum(1, keepdim=True)
    return taps[:, None].to(device, _exact_dtype(device)), half


def resample(pcm: torch.Tensor, sr_in: int, sr_out: int = SAMPLE_RATE) -> torch.Tensor:
    """Band-limited polyphase resampling along the last axis (Kaiser-windowed sinc, 32 zero crossings, beta 12).

    The low-pass sits at 0.94 x the lower Nyquist. Measured (tests/test_audio_features.py): a 1 kHz tone comes out
    within ~1e-6 of the ideal sine; passband flat within 0.1 dB to ~0.85 x the lower Nyquist; tones above 1.05 x the
    output Nyquist are suppressed by > 70 dB. Output sample j sits at input time j * sr_in / sr_out, and every such
    time inside [0, len) is produced: out_len = ceil(len * sr_out / sr_in). Edges see zeros beyond the input.
    """
    if sr_in == sr_out:
        return pcm
    g = math.gcd(sr_in, sr_out)
    orig, new = sr_in // g, sr_out // g
    dtype = pcm.dtype if pcm.is_floating_point() else torch.float32
    taps, half = _sinc_kernel(orig, new, pcm.device)
    n = pcm.shape[-1]
    x = F.pad(pcm.to(taps.dtype).reshape(-1, 1, n), (half, half + orig))
    y = F.conv1d(x, taps, stride=orig).transpose(1, 2).reshape(x.shape[0], -1)
    out_len = -(-n * new // orig)
    return y[:, :out_len].reshape(*pcm.shape[:-1], out_len).to(dtype)


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1000.0) / 1000.0) * 27.0 / np.log(6.4), 3.0 * f / 200.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), 200.0 * m / 3.0)


def mel_filterbank() -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters, float64 [N_FFT // 2 + 1, N_MELS], 0..8 kHz."""
    fft_hz = np.linspace(0.0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(8000.0)), N_MELS + 2))
    width = np.diff(edges)
    rising = (fft_hz[:, None] - edges[None, :-2]) / width[:-1]
    falling = (edges[None, 2:] - fft_hz[:, None]) / width[1:]
    return np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (edges[2:] - edges[:-2]))


@lru_cache(maxsize=8)
def _mel_and_window(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = _exact_dtype(device)
    mel = torch.from_numpy(mel_filterbank().T).to(device, dtype)
    return mel, torch.hann_window(N_FFT, periodic=True, dtype=dtype, device=device)


def _pad_batch(waveforms: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(waveforms, torch.Tensor) and waveforms.dim() <= 2:
        batch = waveforms.float().reshape(-1, waveforms.shape[-1])
        return batch, torch.full((batch.shape[0],), batch.shape[1], device=batch.device)
    if len(waveforms) == 0:
        raise ValueError("log_mel needs at least one waveform")
    device = torch.as_tensor(waveforms[0]).device
    items = [torch.as_tensor(w, device=device).float().reshape(-1) for w in waveforms]
    lengths = torch.tensor([len(w) for w in items], device=device)
    batch = torch.zeros(len(items), int(lengths.max()), device=device)
    for row, w in zip(batch, items, strict=True):
        row[: len(w)] = w
    return batch, lengths


def log_mel(waveforms: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """16 kHz mono waveforms -> (features float32 [B, 128, T], mask int32 [B, T]), as the Qwen3-Omni processor.

    Equals WhisperFeatureExtractor(feature_size=128) called with padding=True (longest), truncation=False,
    return_attention_mask=True: inputs are zero-padded to the longest, T = longest // 160, the clamp at max - 8 uses
    each example's max over its padded array, and example i's mask holds min(ceil(len_i / 160), T) ones. Like the
    reference, a batch whose longest input has <= 200 samples is rejected (reflect padding needs more).
    """
    batch, lengths = _pad_batch(waveforms)
    n = batch.shape[-1]
    if n <= N_FFT // 2:
        raise ValueError(f"longest waveform has {n} samples; log-mel needs more than {N_FFT // 2}")
    mel, window = _mel_and_window(batch.device)
    spec = torch.stft(batch.to(mel.dtype), N_FFT, HOP_LENGTH, window=window, pad_mode="reflect", return_complex=True)
    power = spec[..., :-1].abs().square()
    logs = (mel @ power).float().clamp(min=1e-10).log10()
    logs = torch.maximum(logs, logs.amax(dim=(1, 2), keepdim=True) - 8.0)
    frames = n // HOP_LENGTH
    valid = torch.clamp(-(-lengths // HOP_LENGTH), max=frames)
    mask = (torch.arange(frames, device=batch.device) < valid[:, None]).to(torch.int32)
    return (logs + 4.0) / 4.0, mask


def _halve3(n: torch.Tensor | int) -> torch.Tensor | int:
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


def audio_token_count(n_frames: torch.Tensor | int, n_window: int = 50) -> torch.Tensor | int:
    """Audio encoder output tokens for n_frames mel frames: windows of 2 * n_window frames, each through three
    stride-2 convolutions (13 tokens per full 100-frame window; 1 s -> 13, 2 s -> 26, 3.7 s -> 48)."""
    chunk = 2 * n_window
    return _halve3(n_frames % chunk) + (n_frames // chunk) * _halve3(chunk)
