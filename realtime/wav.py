"""Audio files through soundfile (libsndfile): whatever it reads (WAV, FLAC, OGG, MP3, ...) in; 16-bit PCM WAV out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile
import torch


class AudioFileError(ValueError):
    """An input file that holds no audio we can use; the message says why, without the path."""


def read_wav(path: str | Path) -> tuple[torch.Tensor, int]:
    """Mono float32 samples in [-1, 1] and the sample rate; channels are averaged."""
    try:
        x, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except soundfile.LibsndfileError as e:
        raise AudioFileError(f"cannot read it as audio ({e.error_string.rstrip('.')}): give WAV, FLAC, OGG or "
                             "MP3, or convert it first (e.g. `sox in.m4a out.wav`)") from None
    if x.shape[0] == 0:
        raise AudioFileError("the file holds no audio samples")
    return torch.from_numpy(np.ascontiguousarray(x.mean(axis=1))), int(rate)


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    soundfile.write(str(path), np.clip(samples, -1.0, 1.0), rate, subtype="PCM_16", format="WAV")
