"""Audio front end: Whisper log-mel features of 16 kHz audio and the audio token count."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

from models.common.mel import mel_filterbank as slaney_filters

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
N_MELS = 128


def _exact_dtype(device: torch.device) -> torch.dtype:
    """float32 on CPU; float64 on CUDA, where float32 convolutions would run in TF32 (cudnn.allow_tf32 is on)."""
    return torch.float64 if device.type == "cuda" else torch.float32


def mel_filterbank() -> np.ndarray:
    """Whisper's filters: float64 [N_FFT // 2 + 1, N_MELS], 0..8 kHz."""
    return slaney_filters(SAMPLE_RATE, N_FFT, N_MELS, SAMPLE_RATE / 2)


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
    """16 kHz mono waveforms -> (features float32 [B, 128, T], mask int32 [B, T]), as the Qwen3-Omni processor
    (WhisperFeatureExtractor, 128 bins, padding to the longest): T = longest // 160, the clamp at max - 8 uses
    each example's padded array, mask i holds min(ceil(len_i / 160), T) ones; <= 200 samples is refused."""
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


def downsampled(n: torch.Tensor | int) -> torch.Tensor | int:
    """Length after the encoder's three convolutions (kernel 3, stride 2, padding 1); 0 stays 0."""
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


def audio_token_count(n_frames: torch.Tensor | int, n_window: int = 50) -> torch.Tensor | int:
    """Audio encoder output tokens for n_frames mel frames: windows of 2 * n_window frames, each through three
    stride-2 convolutions (13 tokens per full 100-frame window; 1 s -> 13, 2 s -> 26, 3.7 s -> 48)."""
    chunk = 2 * n_window
    return downsampled(n_frames % chunk) + (n_frames // chunk) * downsampled(chunk)
