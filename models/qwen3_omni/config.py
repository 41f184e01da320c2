"""Qwen3-Omni's config.json: the audio encoder, talker, thinker and whole model (shared parts: models/common)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.config import (
    OPTIONAL,
    Code2WavConfig,
    CodePredictorConfig,
    ConfigError,
    TextConfig,
    read_fields,
    required,
)
from models.common.fp8 import block_size

# The audio encoder's keys that may be absent (their transformers default is the real model's value).
AUDIO_OPTIONAL: dict[str, Any] = {**OPTIONAL, "activation_function": "gelu", "n_window_infer": 800,
                                  "conv_chunksize": 500}
# A text-only checkpoint may omit these (the speaking model's values); a speaking one must have them.
TTS_IDS = {"tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673}


@dataclass(frozen=True)
class AudioEncoderConfig:
    num_mel_bins: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    d_model: int
    downsample_hidden_size: int
    output_dim: int
    n_window: int
    n_window_infer: int
    conv_chunksize: int
    max_source_positions: int
    activation_function: str = "gelu"

    def __post_init__(self) -> None:
        if self.d_model % self.encoder_attention_heads:
            raise ConfigError("audio_config: d_model must divide by encoder_attention_heads")
        if self.n_window_infer % (2 * self.n_window):
            raise ConfigError("audio_config: n_window_infer must be a multiple of 2 * n_window")

    @classmethod
    def from_hf(cls, d: dict) -> AudioEncoderConfig:
        return cls(**read_fields(cls, d, "thinker_config.audio_config", optional=AUDIO_OPTIONAL))


@dataclass(frozen=True)
class TalkerConfig:
    text: TextConfig
    code_predictor: CodePredictorConfig
    thinker_hidden_size: int
    accept_hidden_layer: int
    num_code_groups: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    speakers: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if self.code_predictor.num_code_groups != self.num_code_groups:
            raise ConfigError("talker_config: num_code_groups differs from the code predictor's")
        if self.code_predictor.hidden_size != self.text.hidden_size:
            raise ConfigError("talker_config: code_predictor hidden_size must equal the talker's hidden_size")

    def speaker_id(self, name: str) -> int:
        table = dict(self.speakers)
        if name.lower() not in table:
            raise ConfigError(f"unknown speaker '{name}'; this checkpoint has {sorted(table)}")
        return table[name.lower()]

    @classmethod
    def from_hf(cls, d: dict) -> TalkerConfig:
        w = "talker_config"
        speakers = required(d, "speaker_id", w)
        text = TextConfig.from_hf(required(d, "text_config", w), f"{w}.text_config")
        predictor = CodePredictorConfig.from_hf(required(d, "code_predictor_config", w))
        rest = read_fields(cls, d, w, ("text", "code_predictor", "speakers"), {"codec_eos_id": ("codec_eos_token_id",)})
        speakers = tuple(sorted((k.lower(), int(v)) for k, v in speakers.items()))
        return cls(text=text, code_predictor=predictor, speakers=speakers, **rest)


@dataclass(frozen=True)
class ThinkerConfig:
    audio: AudioEncoderConfig
    text: TextConfig
    audio_token_id: int
    audio_start_token_id: int
    audio_end_token_id: int

    @classmethod
    def from_hf(cls, d: dict) -> ThinkerConfig:
        w = "thinker_config"
        audio = AudioEncoderConfig.from_hf(required(d, "audio_config", w))
        text = TextConfig.from_hf(required(d, "text_config", w), f"{w}.text_config")
        return cls(audio=audio, text=text, **read_fields(cls, d, w, ("audio", "text")))


@dataclass(frozen=True)
class OmniConfig:
    """`talker` and `code2wav` are None for a checkpoint without them (Thinking, Captioner): text out."""

    thinker: ThinkerConfig
    talker: TalkerConfig | None
    code2wav: Code2WavConfig | None
    im_start_token_id: int
    im_end_token_id: int
    system_token_id: int
    user_token_id: int
    assistant_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.talker is None) != (self.code2wav is None):
            raise ConfigError("config.json: talker_config and code2wav_config come together (or neither)")
        if self.talker is None:
            return
        if self.talker.thinker_hidden_size != self.thinker.text.hidden_size:
            raise ConfigError("talker_config.thinker_hidden_size differs from the thinker's hidden_size")
        if not 0 <= self.talker.accept_hidden_layer <= self.thinker.text.num_hidden_layers:
            raise ConfigError("talker_config.accept_hidden_layer is outside the thinker's layers")

    @classmethod
    def from_hf(cls, d: dict) -> OmniConfig:
        block_size(d.get("quantization_config"))  # refuses a quantization the loader does not read
        g = lambda k: required(d, k, "config.json")  # noqa: E731
        speaks = "talker_config" in d
        return cls(thinker=ThinkerConfig.from_hf(g("thinker_config")),
                   talker=TalkerConfig.from_hf(g("talker_config")) if speaks else None,
                   code2wav=Code2WavConfig.from_hf(g("code2wav_config")) if speaks else None, raw=d,
                   **read_fields(cls, d, "config.json", ("thinker", "talker", "code2wav", "raw", *TTS_IDS)),
                   **{k: g(k) if speaks else d.get(k, default) for k, default in TTS_IDS.items()})

    @classmethod
    def from_file(cls, path: str | Path) -> OmniConfig:
        path = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"no config.json at {path}") from e
        return cls.from_hf(d)
