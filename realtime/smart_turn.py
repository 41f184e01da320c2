"""Smart Turn v3.2 (pipecat-ai, BSD-2-Clause): the probability that a speaker has finished their turn, from the
last 8 s of the turn's 16 kHz audio as Whisper log-mel features (`features`). The model file: realtime/turn_model.py."""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

MODEL_NAME = "smart-turn-v3.2-cpu.onnx"
RATE = 16000
WINDOW = 8 * RATE
_N_FFT, _HOP, _N_MELS = 400, 160, 80
ENV = "OMNI_REALTIME_TURN_MODEL"


def turn_model_path() -> Path:
    return Path(os.environ.get(ENV) or Path(sys.prefix) / "share" / "omni-realtime" / MODEL_NAME)


def _mel_filters() -> torch.Tensor:
    """Slaney-scale, area-normalised triangles: [N_MELS, N_FFT // 2 + 1]."""

    def to_mel(f: np.ndarray) -> np.ndarray:
        return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1000) / 1000) * 27 / np.log(6.4), 3 * f / 200)

    def to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= 15, 1000 * np.exp(np.log(6.4) / 27 * (m - 15)), 200 * m / 3)

    fft_hz = np.linspace(0, RATE // 2, _N_FFT // 2 + 1)
    edges = to_hz(np.linspace(to_mel(np.array(0.0)), to_mel(np.array(RATE / 2)), _N_MELS + 2))
    rise = (fft_hz[:, None] - edges[None, :-2]) / np.diff(edges)[:-1]
    fall = (edges[None, 2:] - fft_hz[:, None]) / np.diff(edges)[1:]
    tri = np.maximum(0, np.minimum(rise, fall)) * (2 / (edges[2:] - edges[:-2]))
    return torch.from_numpy(tri.T.copy())


_MELS = _mel_filters()
_HANN = torch.hann_window(_N_FFT, periodic=True, dtype=torch.float64)


def features(audio: np.ndarray) -> np.ndarray:
    """16 kHz float audio (any length) -> the model's input [1, 80, 800] float32, from its last 8 s."""
    x = np.asarray(audio, np.float32).reshape(-1)[-WINDOW:]
    x = np.concatenate([np.zeros(WINDOW - len(x), np.float32), x])
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    spec = torch.stft(torch.from_numpy(x.astype(np.float64)), _N_FFT, _HOP, window=_HANN, center=True,
                      pad_mode="reflect", return_complex=True)
    logs = (_MELS @ spec.abs().square()).clamp(min=1e-10).log10()[:, :-1]
    logs = torch.maximum(logs, logs.max() - 8.0)
    return ((logs + 4.0) / 4.0).float().numpy()[None]


@lru_cache(maxsize=4)
def onnx_session(path: str) -> ort.InferenceSession:
    """One single-threaded CPU session per model file, shared by every stream."""
    opts = ort.SessionOptions()
    opts.inter_op_num_threads = opts.intra_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


class SmartTurn:
    def __init__(self, path: Path | None = None) -> None:
        path = path or turn_model_path()
        if not path.is_file():
            raise FileNotFoundError(f"Smart Turn model not found at {path} (run `make serve` or "
                                    f"`python -m realtime.turn_model fetch`, or set {ENV})")
        self._model = onnx_session(str(path))

    def complete(self, audio: np.ndarray) -> float:
        """P(the turn is finished) for the turn's 16 kHz audio so far (the last 8 s are read)."""
        out = self._model.run(None, {"input_features": features(audio)})
        return float(np.asarray(out[0]).reshape(-1)[0])
