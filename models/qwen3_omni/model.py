"""The whole Qwen3-Omni: thinker (audio encoder + MoE LLM), talker (+ code predictor), Code2Wav; a
checkpoint without a talker (Thinking, Captioner) has `talker`, `code2wav` None. Checkpoint names are ours as
they are, except the vision tower's (image and video input are not served yet), skipped without being read."""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path

import torch
from torch import nn

from models.common.code2wav import Code2Wav
from models.common.fp8 import BLOCK, fp8_experts_
from models.common.gpu_memory import check_fits
from models.common.weights import Rename, checkpoint_block, random_weights_
from models.common.weights import load_weights as load_any

from .config import OmniConfig
from .talker import Talker
from .thinker import Thinker
from .tiny import PRESETS

log = logging.getLogger(__name__)
VISION_PREFIX = "thinker.visual."
SPEAKING = ("talker.", "code2wav.")  # what another model's voice replaces (load_model's `speaks` False)


def _skipping(*prefixes: str) -> Rename:
    return lambda key: None if key.startswith(prefixes) else key


load_weights = partial(load_any, rename=_skipping(VISION_PREFIX))


class Qwen3Omni(nn.Module):
    def __init__(self, cfg: OmniConfig, speaks: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.thinker = Thinker(cfg.thinker)
        self.talker = Talker(cfg.talker) if cfg.talker is not None and speaks else None
        self.code2wav = Code2Wav(cfg.code2wav) if cfg.code2wav is not None and speaks else None


def load_model(model: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0, quantization: str | None = None, speaks: bool = True) -> Qwen3Omni:
    """A tiny preset with seeded random weights, or a checkpoint directory streamed in one pass onto `device`.
    MoE experts in fp8 with `quantization` "fp8" or when the checkpoint stores them in fp8 128x128 blocks: quantized
    (or copied) as they are read, never held in `dtype`. `speaks` False: no talker or Code2Wav, never read."""
    start = time.perf_counter()
    if str(model) in PRESETS:
        cfg = OmniConfig.from_hf(PRESETS[str(model)]())
        net = Qwen3Omni(cfg, speaks)
        random_weights_(net, seed)  # the thinker's values come first, whether the rest is built or not
        net = net.to(device=device, dtype=dtype)
        if quantization:
            fp8_experts_(net)
    else:
        cfg = OmniConfig.from_file(model)
        with torch.device("meta"):
            net = Qwen3Omni(cfg, speaks)
        if quantization or checkpoint_block(model) == BLOCK:
            fp8_experts_(net, empty=True)
        check_fits(net, device, dtype)
        skip = (VISION_PREFIX,) if speaks else (VISION_PREFIX, *SPEAKING)
        load_any(net, model, device=device, dtype=dtype, rename=_skipping(*skip))
    return _ready(net, model, device, dtype, start)


def random_model(cfg: OmniConfig, device: torch.device | str, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 quantization: str | None = None) -> Qwen3Omni:
    """Any size with seeded random weights made on `device` (benchmarks: full size without a checkpoint);
    `quantization` "fp8": the experts made in fp8 layer by layer, as `fp8_experts_` would round them."""
    start = time.perf_counter()
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are allocated once, in their final dtype
    try:
        with torch.device("meta"):
            net = Qwen3Omni(cfg)
    finally:
        torch.set_default_dtype(default)
    if quantization:
        fp8_experts_(net, empty=True)
    check_fits(net, device, dtype)
    net = net.to_empty(device=device)
    random_weights_(net, seed, dtype)
    return _ready(net, "random weights", device, dtype, start)


def _ready(net: Qwen3Omni, name: object, device: torch.device | str, dtype: torch.dtype, start: float) -> Qwen3Omni:
    n = sum(p.numel() for p in net.parameters())
    log.info("loaded %s: %.2f B parameters, %s %s, %.1f s", name, n / 1e9, device, dtype, time.perf_counter() - start)
    return net.eval().requires_grad_(False)
