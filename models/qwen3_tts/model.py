"""Qwen3-TTS as one module tree: the talker (with its code predictor) and the 12 Hz codec's decoder.

A checkpoint directory holds the model (config.json, model.safetensors) and the speech tokenizer in its
`speech_tokenizer/` folder (its own config.json and model.safetensors). The preset `tiny-tts` is built
from tiny.py with seeded random weights.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from torch import nn

from models.common.code2wav import Code2Wav
from models.common.config import Code2WavConfig
from models.common.weights import load_weights

from .config import TtsConfig
from .talker import Talker
from .tiny import PRESETS, random_weights_, tiny_codec

log = logging.getLogger(__name__)
SPEAKER_ENCODER = "speaker_encoder."  # Base's x-vector encoder: not served yet, so not read


def talker_name(key: str) -> str | None:
    return None if key.startswith(SPEAKER_ENCODER) else key


class Qwen3Tts(nn.Module):
    def __init__(self, cfg: TtsConfig, codec: Code2WavConfig | None) -> None:
        super().__init__()
        self.cfg = cfg
        self.talker = Talker(cfg.talker)
        self.code2wav = Code2Wav(codec) if codec is not None else None


def codec_config(model: str | Path) -> Code2WavConfig:
    if str(model) in PRESETS:
        return Code2WavConfig.from_hf(tiny_codec())
    path = Path(model) / "speech_tokenizer" / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model}: no speech_tokenizer/config.json (the 12 Hz speech tokenizer)")
    return Code2WavConfig.from_hf(json.loads(path.read_text())["decoder_config"])


def load_model(model: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0) -> Qwen3Tts:
    """`model`: the preset 'tiny-tts' or a checkpoint directory."""
    start = time.perf_counter()
    if str(model) in PRESETS:
        net = Qwen3Tts(TtsConfig.from_hf(PRESETS[str(model)]()), codec_config(model))
        random_weights_(net, seed)
        net = net.to(device=device, dtype=dtype)
    else:
        net = load_talker(model, device, dtype)
        raise NotImplementedError("the 12 Hz speech tokenizer's decoder is not wired in yet")
    n = sum(p.numel() for p in net.parameters())
    log.info("loaded %s: %.1f M parameters, %s %s, %.1f s", model, n / 1e6, device, dtype, time.perf_counter() - start)
    return net.eval().requires_grad_(False)


def load_talker(model: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Qwen3Tts:
    """The checkpoint's talker alone (no codec decoder): what the codes depend on."""
    cfg = TtsConfig.from_file(model)
    with torch.device("meta"):
        net = Qwen3Tts(cfg, None)
    load_weights(net.talker, model, prefix="talker.", device=device, dtype=dtype, rename=talker_name)
    return net.eval().requires_grad_(False)
