"""Slaney mel filters (librosa's default, as Whisper's feature extractor and the TTS speaker encoder build them)."""

from __future__ import annotations

import numpy as np


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1000.0) / 1000.0) * 27.0 / np.log(6.4), 3.0 * f / 200.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), 200.0 * m / 3.0)


def mel_filterbank(rate: int, n_fft: int, mels: int, fmax: float) -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters from 0 to `fmax` Hz, float64 [n_fft // 2 + 1, mels]."""
    fft_hz = np.linspace(0.0, rate // 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(float(fmax))), mels + 2))
    width = np.diff(edges)
    rising = (fft_hz[:, None] - edges[None, :-2]) / width[:-1]
    falling = (edges[None, 2:] - fft_hz[:, None]) / width[1:]
    return np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (edges[2:] - edges[:-2]))
