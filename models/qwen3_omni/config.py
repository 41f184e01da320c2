"""Qwen3-Omni configuration, parsed from a checkpoint's config.json.

Both the transformers-5 form (`rope_parameters`) and the older hub form (`rope_theta` + `rope_scaling`)
are read. Sizes and ids are required: a missing one is an error, never a silently wrong default.
Only settings whose class default equals the real checkpoint's value may be omitted (see OPTIONAL).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    pass


# Keys that may be absent: their transformers default is also the real model's value.
OPTIONAL: dict[str, Any] = {
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": (),
    "shared_expert_intermediate_size": 0,
    "activation_function": "gelu",
    "n_window_infer": 800,
    "conv_chunksize": 500,
}


def _get(d: dict, key: str, where: str, *aliases: str) -> Any:
    for k in (key, *aliases):
        if k in d and d[k] is not None:
            return d[k]
    if key in OPTIONAL:
        return OPTIONAL[key]
    raise ConfigError(f"required key '{key}' is missing from config.json" + ("" if where == "config.json" else
                                                                              f" (in {where})"))


def _rope(d: dict, where: str) -> tuple[float, tuple[int, ...], bool]:
    """(theta, mrope_section, interleaved) from either config form."""
    params = d.get("rope_parameters") or {}
    legacy = d.get("rope_scaling") or {}
    theta = params.get("rope_theta", d.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"{where}: no rope_theta in rope_parameters or at top level")
    section = params.get("mrope_section", legacy.get("mrope_section")) or ()
    interleaved = bool(params.get("interleaved", legacy.get("interleaved", False)))
    return float(theta), tuple(int(x) for x in section), interleaved


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
        w = "thinker_config.audio_config"
        names = [f for f in cls.__dataclass_fields__]
        return cls(**{n: _get(d, n, w) for n in names})


@dataclass(frozen=True)
class TextConfig:
    """A decoder-only transformer with optional MoE: the thinker LLM and the talker backbone."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    shared_expert_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    hidden_act: str = "silu"
    attention_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("text_config: num_attention_heads must divide by num_key_value_heads")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ConfigError("text_config: num_experts_per_tok must be in 1..num_experts")
        if self.mrope_section and 2 * sum(self.mrope_section) != self.head_dim:
            raise ConfigError(f"text_config: mrope_section {self.mrope_section} must sum to head_dim / 2")
        if self.hidden_act != "silu":
            raise ConfigError(f"text_config: hidden_act '{self.hidden_act}' is not supported (silu only)")

    def is_moe_layer(self, i: int) -> bool:
        return (
            self.num_experts > 0 and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_hf(cls, d: dict, where: str) -> TextConfig:
        theta, section, interleaved = _rope(d, where)
        g = lambda k, *a: _get(d, k, where, *a)  # noqa: E731
        return cls(
            vocab_size=g("vocab_size"),
            hidden_size=g("hidden_size"),
            intermediate_size=g("intermediate_size"),
            num_hidden_layers=g("num_hidden_layers"),
            num_attention_heads=g("num_attention_heads"),
            num_key_value_heads=g("num_key_value_heads"),
            head_dim=g("head_dim"),
            num_experts=g("num_experts", "num_local_experts"),
            num_experts_per_tok=g("num_experts_per_tok"),
            moe_intermediate_size=g("moe_intermediate_size"),
            norm_topk_prob=bool(g("norm_topk_prob")),
            rms_norm_eps=float(g("rms_norm_eps")),
            rope_theta=theta,
            mrope_section=section,
            mrope_interleaved=interleaved,
            shared_expert_intermediate_size=g("shared_expert_intermediate_size"),
            decoder_sparse_step=g("decoder_sparse_step"),
            mlp_only_layers=tuple(g("mlp_only_layers")),
            hidden_act=g("hidden_act"),
            attention_bias=bool(g("attention_bias")),
        )


@dataclass(frozen=True)
class CodePredictorConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_code_groups: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool = False

    @classmethod
    def from_hf(cls, d: dict) -> CodePredictorConfig:
        w = "talker_config.code_predictor_config"
        theta, _, _ = _rope(d, w)
        names = [f for f in cls.__dataclass_fields__ if f != "rope_theta"]
        return cls(rope_theta=theta, **{n: _get(d, n, w) for n in names})


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
        speakers = _get(d, "speaker_id", w)
        return cls(
            text=TextConfig.from_hf(_get(d, "text_config", w), f"{w}.text_config"),
            code_predictor=CodePredictorConfig.from_hf(_get(d, "code_predictor_config", w)),
            thinker_hidden_size=_get(d, "thinker_hidden_size", w),
            accept_hidden_layer=_get(d, "accept_hidden_layer", w),
            num_code_groups=_get(d, "num_code_groups", w),
            codec_pad_id=_get(d, "codec_pad_id", w),
            codec_bos_id=_get(d, "codec_bos_id", w),
            codec_eos_id=_get(d, "codec_eos_token_id", w),
            codec_nothink_id=_get(d, "codec_nothink_id", w),
            codec_think_bos_id=_get(d, "codec_think_bos_id", w),
            codec_think_eos_id=_get(d, "codec_think_eos_id", w),
            speakers=tuple(sorted((k.lower(), int(v)) for k, v in speakers.items())),
        )


@dataclass(frozen=True)
class Code2WavConfig:
    codebook_size: int
    num_quantizers: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    sliding_window: int
    decoder_dim: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    rms_norm_eps: float
    layer_scale_initial_scale: float
    rope_theta: float
    max_position_embeddings: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for r in (*self.upsampling_ratios, *self.upsample_rates):
            n *= r
        return n

    @classmethod
    def from_hf(cls, d: dict) -> Code2WavConfig:
        w = "code2wav_config"
        theta, _, _ = _rope(d, w)
        names = [f for f in cls.__dataclass_fields__ if f not in ("rope_theta", "rms_norm_eps")]
        vals = {n: _get(d, n, w) for n in names}
        vals["rms_norm_eps"] = float(d.get("rms_norm_eps", 1e-5))  # Code2Wav's own default differs
        vals["upsample_rates"] = tuple(vals["upsample_rates"])
        vals["upsampling_ratios"] = tuple(vals["upsampling_ratios"])
        return cls(rope_theta=theta, **vals)


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
        return cls(
            audio=AudioEncoderConfig.from_hf(_get(d, "audio_config", w)),
            text=TextConfig.from_hf(_get(d, "text_config", w), f"{w}.text_config"),
            audio_token_id=_get(d, "audio_token_id", w),
            audio_start_token_id=_get(d, "audio_start_token_id", w),
            audio_end_token_id=_get(d, "audio_end_token_id", w),
        )


@dataclass(frozen=True)
class OmniConfig:
    thinker: ThinkerConfig
    talker: TalkerConfig
    code2wav: Code2WavConfig
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
        if self.talker.thinker_hidden_size != self.thinker.text.hidden_size:
            raise ConfigError("talker_config.thinker_hidden_size differs from the thinker's hidden_size")
        if not 0 <= self.talker.accept_hidden_layer <= self.thinker.text.num_hidden_layers:
            raise ConfigError("talker_config.accept_hidden_layer is outside the thinker's layers")

    @classmethod
    def from_hf(cls, d: dict) -> OmniConfig:
        g = lambda k: _get(d, k, "config.json")  # noqa: E731
        return cls(
            thinker=ThinkerConfig.from_hf(g("thinker_config")),
            talker=TalkerConfig.from_hf(g("talker_config")),
            code2wav=Code2WavConfig.from_hf(g("code2wav_config")),
            im_start_token_id=g("im_start_token_id"),
            im_end_token_id=g("im_end_token_id"),
            system_token_id=g("system_token_id"),
            user_token_id=g("user_token_id"),
            assistant_token_id=g("assistant_token_id"),
            tts_pad_token_id=g("tts_pad_token_id"),
            tts_bos_token_id=g("tts_bos_token_id"),
            tts_eos_token_id=g("tts_eos_token_id"),
            raw=d,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> OmniConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"no config.json at {path}") from e
        return cls.from_hf(d)
