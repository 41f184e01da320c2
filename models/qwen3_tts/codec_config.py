"""The 12 Hz speech tokenizer's `speech_tokenizer/config.json`: `decoder_config` is Code2Wav's plus
`latent_dim`, `codebook_dim` and an optional `head_dim`; `encoder_config` goes to transformers' MimiConfig.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.config import Code2WavConfig, ConfigError

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"

# the reference decoder config class's defaults
DECODER_DEFAULTS: dict[str, Any] = {
    "codebook_size": 2048, "hidden_size": 1024, "latent_dim": 1024, "max_position_embeddings": 8000,
    "rope_theta": 10000, "num_attention_heads": 16, "num_key_value_heads": 16, "sliding_window": 72,
    "intermediate_size": 3072, "layer_scale_initial_scale": 0.01, "rms_norm_eps": 1e-5, "num_hidden_layers": 8,
    "num_quantizers": 16, "upsample_rates": (8, 5, 4, 3), "upsampling_ratios": (2, 2), "decoder_dim": 1536,
}


@dataclass(frozen=True)
class CodecDecoderConfig(Code2WavConfig):
    latent_dim: int = 1024
    codebook_dim: int = 512
    head_size: int = 0  # 0: hidden_size // num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, d: dict) -> CodecDecoderConfig:
        d = {**DECODER_DEFAULTS, **{k: v for k, v in d.items() if v is not None}}
        if "codebook_dim" not in d:
            raise ConfigError("required key 'codebook_dim' is missing from speech_tokenizer/config.json")
        base = Code2WavConfig.from_hf(d)
        fields = {n: getattr(base, n) for n in Code2WavConfig.__dataclass_fields__}
        return cls(**fields, latent_dim=int(d["latent_dim"]), codebook_dim=int(d["codebook_dim"]),
                   head_size=int(d.get("head_dim") or 0))


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    decoder: CodecDecoderConfig
    encoder: dict[str, Any] = field(default_factory=dict)  # MimiConfig's keys
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    @classmethod
    def from_hf(cls, d: dict) -> SpeechTokenizerConfig:
        if d.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ConfigError(f"speech tokenizer model_type is {d.get('model_type')!r}, expected {MODEL_TYPE!r}")
        dec = CodecDecoderConfig.from_hf(d.get("decoder_config") or {})
        cfg = cls(dec, dict(d.get("encoder_config") or {}), **{
            k: int(d[k]) for k in ("encoder_valid_num_quantizers", "input_sample_rate", "output_sample_rate",
                                   "decode_upsample_rate", "encode_downsample_rate") if d.get(k) is not None
        })
        if cfg.decode_upsample_rate != dec.samples_per_frame:
            raise ConfigError(f"decode_upsample_rate {cfg.decode_upsample_rate} != the decoder's "
                              f"{dec.samples_per_frame} samples per frame")
        return cfg

    @classmethod
    def load(cls, directory: str | Path) -> SpeechTokenizerConfig:
        path = Path(directory) / "config.json"
        if not path.is_file():
            raise ConfigError(f"no speech tokenizer config at {path}")
        return cls.from_hf(json.loads(path.read_text()))
