"""Qwen3-TTS's config.json (model_type `qwen3_tts`), read strictly: sizes and ids are required; only the
reference's own fallbacks apply (no `head_dim`: hidden_size / num_attention_heads, as its attention does)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from models.common.config import CodePredictorConfig, ConfigError, TextConfig, read_fields, required, rope_params

MODEL_TYPES = ("custom_voice", "base", "voice_design")
# the reference speaker encoder config class's defaults
SPEAKER_ENCODER_DEFAULTS = {"mel_dim": 128, "enc_dim": 1024, "enc_channels": [512, 512, 512, 512, 1536],
                            "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
                            "enc_attention_channels": 128, "enc_res2net_scale": 8, "enc_se_channels": 128,
                            "sample_rate": 24000}


@dataclass(frozen=True)
class TalkerConfig:
    text: TextConfig  # the dense backbone
    code_predictor: CodePredictorConfig
    text_hidden_size: int  # width of the text embedding
    text_vocab_size: int
    num_code_groups: int
    codec_eos_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_pad_id: int
    codec_bos_id: int
    speakers: tuple[tuple[str, int], ...]  # (name, codec id), lower-case names as the config spells them
    dialects: tuple[tuple[str, str], ...]  # speaker -> the dialect language it speaks in Chinese / auto
    languages: tuple[tuple[str, int], ...]  # language (lower case) -> codec id

    def speaker_id(self, name: str) -> int:
        return dict(self.speakers)[name.lower()]

    def language_id(self, language: str, speaker: str = "") -> int | None:
        """The codec language id for `language` ("auto": none); a dialect speaker speaking Chinese or auto
        uses its dialect, as the reference does."""
        lang = language.lower() or "auto"
        dialect = dict(self.dialects).get(speaker.lower()) if speaker else None
        if dialect and lang in ("chinese", "auto"):
            return dict(self.languages)[dialect]
        return None if lang == "auto" else dict(self.languages)[lang]

    @classmethod
    def from_hf(cls, d: dict) -> TalkerConfig:
        w = "talker_config"
        g = lambda k: required(d, k, w)  # noqa: E731
        theta, _, _ = rope_params(d, w)  # every position's three mrope rows are equal: plain rope
        heads = g("num_attention_heads")
        text = TextConfig(
            vocab_size=g("vocab_size"), hidden_size=g("hidden_size"), intermediate_size=g("intermediate_size"),
            num_hidden_layers=g("num_hidden_layers"), num_attention_heads=heads,
            num_key_value_heads=g("num_key_value_heads"), head_dim=d.get("head_dim") or g("hidden_size") // heads,
            num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, norm_topk_prob=False,
            rms_norm_eps=float(g("rms_norm_eps")), rope_theta=theta, mrope_section=(), mrope_interleaved=False,
            hidden_act=g("hidden_act"), attention_bias=bool(g("attention_bias")))
        cp = CodePredictorConfig.from_hf(g("code_predictor_config"))
        ids = read_fields(cls, d, w, ("text", "code_predictor", "speakers", "dialects", "languages"),
                          {"codec_eos_id": ("codec_eos_token_id",)})
        cfg = cls(text=text, code_predictor=cp, **ids,
                  speakers=tuple((k.lower(), int(v)) for k, v in (d.get("spk_id") or {}).items()),
                  dialects=tuple((k.lower(), v.lower()) for k, v in (d.get("spk_is_dialect") or {}).items() if v),
                  languages=tuple((k.lower(), int(v)) for k, v in g("codec_language_id").items()))
        if cp.num_code_groups != cfg.num_code_groups:
            raise ConfigError("talker_config: code_predictor_config.num_code_groups differs from the talker's")
        return cfg


@dataclass(frozen=True)
class TtsConfig:
    model_type: str  # tts_model_type: custom_voice, base or voice_design
    model_size: str  # tts_model_size, e.g. "1b7" or "0b6"
    talker: TalkerConfig
    speaker_encoder: dict | None  # Base only: speaker_encoder_config as written
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int

    @classmethod
    def from_hf(cls, d: dict) -> TtsConfig:
        if d.get("model_type") != "qwen3_tts":
            raise ConfigError(f"model_type must be 'qwen3_tts', not {d.get('model_type')!r}")
        kind = required(d, "tts_model_type", "config.json")
        if kind not in MODEL_TYPES:
            raise ConfigError(f"tts_model_type {kind!r} is not one of {MODEL_TYPES}")
        g = lambda k: required(d, k, "config.json")  # noqa: E731
        encoder = {**SPEAKER_ENCODER_DEFAULTS, **g("speaker_encoder_config")} if kind == "base" else None
        talker = TalkerConfig.from_hf(g("talker_config"))
        if encoder is not None and (encoder["enc_dim"] != talker.text.hidden_size or encoder["sample_rate"] != 24000):
            raise ConfigError("speaker_encoder_config: enc_dim must be the talker's hidden_size, sample_rate 24000")
        return cls(kind, str(d.get("tts_model_size") or ""), talker, encoder,
                   g("im_start_token_id"), g("im_end_token_id"), g("tts_pad_token_id"), g("tts_bos_token_id"),
                   g("tts_eos_token_id"))

    @classmethod
    def from_file(cls, model: str | Path) -> TtsConfig:
        return cls.from_hf(json.loads((Path(model) / "config.json").read_text()))

    @property
    def takes_instructions(self) -> bool:
        """The reference drops `instruct` for 0.6B CustomVoice; Base never takes one."""
        if self.model_type == "base":
            return False
        return not (self.model_type == "custom_voice" and self.model_size in "0b6")
