"""WAV files in and out (PCM16 via the standard library; float32 WAV read too)."""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np
import torch


def read_wav(path: str | Path) -> tuple[torch.Tensor, int]:
    """Mono float32 samples in [-1, 1] and the sample rate; stereo is averaged."""
    data = Path(path).read_bytes()
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"{path}: not a RIFF/WAVE file")
    fmt, body, pos = None, None, 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        chunk = data[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            fmt = struct.unpack("<HHIIHH", chunk[:16])
        elif cid == b"data":
            body = chunk
        pos += 8 + size + (size & 1)
    if fmt is None or body is None:
        raise ValueError(f"{path}: missing fmt or data chunk")
    tag, channels, rate, _, _, bits = fmt
    if tag == 1 and bits == 16:
        x = np.frombuffer(body[: len(body) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
    elif tag == 3 and bits == 32:
        x = np.frombuffer(body[: len(body) // 4 * 4], dtype="<f4").astype(np.float32)
    else:
        raise ValueError(f"{path}: only 16-bit PCM and 32-bit float WAV are supported (format {tag}, {bits} bits)")
    x = x[: len(x) // channels * channels].reshape(-1, channels).mean(axis=1)
    return torch.from_numpy(x.copy()), rate


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
