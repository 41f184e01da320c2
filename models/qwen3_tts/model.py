"""Qwen3-TTS as one module tree: the talker (with its code predictor), Base's speaker encoder and the 12 Hz
codec's decoder, from a checkpoint directory (the codec in its `speech_tokenizer/` folder) or a preset."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from torch import nn

from models.common.code2wav import Code2Wav
from models.common.weights import load_weights, random_weights_

from .codec import CodecDecoderConfig, SpeechTokenizerConfig, build_decoder, load_decoder
from .config import TtsConfig
from .speaker_encoder import SpeakerEncoder
from .speech_tokenizer import SpeechTokenizer, load_encoder
from .talker import Talker
from .tiny import PRESETS, tiny_codec

log = logging.getLogger(__name__)
SPEECH_TOKENIZER = "speech_tokenizer"


class Qwen3Tts(nn.Module):
    def __init__(self, cfg: TtsConfig, code2wav: Code2Wav | None) -> None:
        super().__init__()
        self.cfg = cfg
        self.talker = Talker(cfg.talker)
        self.speaker_encoder = SpeakerEncoder(cfg.speaker_encoder) if cfg.speaker_encoder is not None else None
        self.code2wav = code2wav
        self.speech_tokenizer: SpeechTokenizer | None = None  # Base from a checkpoint: encodes reference audio

    def speaker_row(self, reference_audio: torch.Tensor | None, speaker: str) -> torch.Tensor | None:
        """The prompt's speaker row [H]: Base's x-vector of the reference audio, a named speaker's codec row, or
        None (the caller's settings were resolved: only Base takes reference audio)."""
        if reference_audio is not None:
            if reference_audio.numel() < 2 * 1024 or not bool(torch.isfinite(reference_audio).all()):
                raise ValueError("reference audio must be finite and longer than 0.1 s")
            return self.speaker_encoder.embed(reference_audio.clamp(-1, 1))
        if not speaker:
            return None
        ids = torch.tensor(self.cfg.talker.speaker_id(speaker), device=self.talker.codec_head.weight.device)
        return self.talker.embed_codec(ids)


def load_model(model: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0) -> Qwen3Tts:
    start = time.perf_counter()
    if str(model) in PRESETS:
        codec = build_decoder(CodecDecoderConfig.from_hf(tiny_codec()))
        net = Qwen3Tts(TtsConfig.from_hf(PRESETS[str(model)]()), codec)
        random_weights_(net, seed)
        net = net.to(device=device, dtype=dtype)
    else:
        net = load_talker(model, device, dtype)
        speech = Path(model) / SPEECH_TOKENIZER
        codec = SpeechTokenizerConfig.load(speech)
        net.code2wav = load_decoder(codec.decoder, speech, device, dtype)
        if net.cfg.model_type == "base":
            net.speech_tokenizer = SpeechTokenizer(codec, net.code2wav, load_encoder(codec, speech, device))
    n = sum(p.numel() for p in net.parameters())
    log.info("loaded %s: %.1f M parameters, %s %s, %.1f s", model, n / 1e6, device, dtype, time.perf_counter() - start)
    return net.eval().requires_grad_(False)


def load_talker(model: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Qwen3Tts:
    """The checkpoint's talker (and Base's speaker encoder), without the codec: what the codes depend on."""
    cfg = TtsConfig.from_file(model)
    with torch.device("meta"):
        net = Qwen3Tts(cfg, None)
    load_weights(net.talker, model, prefix="talker.", device=device, dtype=dtype)
    if net.speaker_encoder is not None:
        load_weights(net.speaker_encoder, model, prefix="speaker_encoder.", device=device, dtype=dtype)
    return net.eval().requires_grad_(False)
