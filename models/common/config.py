"""Config dataclasses shared by models (a decoder-only transformer, the code predictor, Code2Wav), parsed from
config.json in transformers 5's form (`rope_parameters`) or the older one (`rope_theta` + `rope_scaling`). Sizes and
ids are required, never a silently wrong default; only keys whose default is the real checkpoint's may be left out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    pass


OPTIONAL: dict[str, Any] = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
                            "decoder_sparse_step": 1, "mlp_only_layers": (), "shared_expert_intermediate_size": 0}


def required(d: dict, key: str, where: str, *aliases: str, optional: dict[str, Any] = OPTIONAL) -> Any:
    """`d[key]` (or the first alias present); the `optional` default if absent, else a ConfigError."""
    for k in (key, *aliases):
        if k in d and d[k] is not None:
            return d[k]
    if key in optional:
        return optional[key]
    inside = "" if where == "config.json" else f" (in {where})"
    raise ConfigError(f"required key '{key}' is missing from config.json{inside}")


def read_fields(cls: type, d: dict, where: str, skip: tuple[str, ...] = (),
                keys: dict[str, tuple[str, ...]] | None = None, optional: dict[str, Any] = OPTIONAL) -> dict[str, Any]:
    """`required` for each field of the dataclass `cls` but `skip`, in field order; `keys` gives a field's
    config.json key (then its aliases) where it is not the field's name."""
    out = {}
    for name in cls.__dataclass_fields__:
        if name not in skip:
            key, *aliases = (keys or {}).get(name, (name,))
            out[name] = required(d, key, where, *aliases, optional=optional)
    return out


def rope_params(d: dict, where: str) -> tuple[float, tuple[int, ...], bool]:
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
        return self.num_experts > 0 and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_hf(cls, d: dict, where: str) -> TextConfig:
        theta, section, interleaved = rope_params(d, where)
        v = read_fields(cls, d, where, ("rope_theta", "mrope_section", "mrope_interleaved"),
                        {"num_experts": ("num_experts", "num_local_experts")})
        v.update(norm_topk_prob=bool(v["norm_topk_prob"]), rms_norm_eps=float(v["rms_norm_eps"]),
                 mlp_only_layers=tuple(v["mlp_only_layers"]), attention_bias=bool(v["attention_bias"]))
        return cls(rope_theta=theta, mrope_section=section, mrope_interleaved=interleaved, **v)


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
        theta, _, _ = rope_params(d, w)
        return cls(rope_theta=theta, **read_fields(cls, d, w, ("rope_theta",)))


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
        return math.prod((*self.upsampling_ratios, *self.upsample_rates))

    @classmethod
    def from_hf(cls, d: dict) -> Code2WavConfig:
        w = "code2wav_config"
        theta, _, _ = rope_params(d, w)
        vals = read_fields(cls, d, w, ("rope_theta", "rms_norm_eps"))
        vals["rms_norm_eps"] = float(d.get("rms_norm_eps", 1e-5))  # Code2Wav's own default differs
        vals["upsample_rates"] = tuple(vals["upsample_rates"])
        vals["upsampling_ratios"] = tuple(vals["upsampling_ratios"])
        return cls(rope_theta=theta, **vals)
