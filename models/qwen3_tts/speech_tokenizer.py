"""The 12 Hz speech tokenizer of a Qwen3-TTS checkpoint (its `speech_tokenizer/` folder): a Code2Wav
decoder and a Mimi encoder (run by transformers' MimiModel) turning reference audio into codes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from models.common.code2wav import Code2Wav
from models.common.weights import WeightError

from .codec import SpeechTokenizerConfig, load_decoder

ENCODER_PREFIX = "encoder."


# The reference saves transformers 4.x's MimiModel layout; transformers 5 nests the encoder half.
_MIMI_V5 = (("encoder.", "encoder.encoder_seanet."), ("encoder_transformer.", "encoder.encoder_transformer."),
            ("downsample.", "encoder.downsample."))


def mimi_name(key: str) -> str:
    for old, new in _MIMI_V5:
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def load_encoder(cfg: SpeechTokenizerConfig, directory: str | Path, device: torch.device | str = "cpu") -> nn.Module:
    """MimiModel without its decoder half, in float32."""
    from transformers import MimiConfig, MimiModel

    # as the reference's transformers (4.57) runs it: its attention plain causal, the sliding window unused
    model = MimiModel(MimiConfig(**{**cfg.encoder, "sliding_window": 2**31 - 1}))
    model.decoder = None
    state: dict[str, torch.Tensor] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if key.startswith(ENCODER_PREFIX):
                    state[mimi_name(key[len(ENCODER_PREFIX) :])] = f.get_tensor(key).float()
    if not state:
        raise WeightError(f"no encoder tensors ({ENCODER_PREFIX}*) in {directory}")
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise WeightError(f"speech tokenizer encoder in {directory} does not match: missing "
                          f"{result.missing_keys[:10]}, unexpected {result.unexpected_keys[:10]}")
    return model.to(device).eval()


@dataclass
class SpeechTokenizer:
    config: SpeechTokenizerConfig
    decoder: Code2Wav
    encoder: nn.Module

    @classmethod
    def load(cls, directory: str | Path, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> SpeechTokenizer:
        cfg = SpeechTokenizerConfig.load(directory)
        return cls(cfg, load_decoder(cfg.decoder, directory, device, dtype), load_encoder(cfg, directory, device))

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [F, Q] -> waveform [F * samples_per_frame], float32 in [-1, 1]."""
        if codes.dim() != 2 or codes.shape[1] != self.config.decoder.num_quantizers:
            raise ValueError(f"expected codes [F, {self.config.decoder.num_quantizers}], got {tuple(codes.shape)}")
        return self.decoder.decode(codes.T[None].to(next(self.decoder.parameters()).device))[0, 0].float()

    @torch.no_grad()
    def encode(self, wave: torch.Tensor, rate: int) -> torch.Tensor:
        """Mono waveform [T] (floats in [-1, 1]) at `rate` Hz -> codes [ceil(T' / 1920), Q] (int64), T' the
        length at the tokenizer's input rate."""
        if wave.dim() != 1 or wave.numel() == 0:
            raise ValueError(f"expected a non-empty mono waveform [T], got {tuple(wave.shape)}")
        target = self.config.input_sample_rate
        if rate != target:
            from realtime.pcm import resample

            wave = resample(wave.float(), rate, target)
        device = next(self.encoder.parameters()).device
        out = self.encoder.encode(wave.float().to(device)[None, None], return_dict=True)
        frames = -(-wave.shape[-1] // self.config.encode_downsample_rate)
        return out.audio_codes[0, : self.config.encoder_valid_num_quantizers, :frames].T.contiguous()
