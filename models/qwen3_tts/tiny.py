"""The tiny preset `tiny-tts`: a CustomVoice config in the published layout (the real vocabulary, special
ids, speakers and languages) with small sizes and seeded random weights, replies capped at 4 s."""

from __future__ import annotations

import copy

from .spec import DEFAULTS

TEXT_VOCAB = 151936  # the Qwen tokenizer's vocabulary, as the text embedding's rows
SPEAKERS = {"vivian": 3065, "serena": 3066, "uncle_fu": 3010, "dylan": 2878, "eric": 2875, "ryan": 3061,
            "aiden": 2861, "ono_anna": 2873, "sohee": 2864}
DIALECTS = {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071, "spanish": 2054,
             "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069, "beijing_dialect": 2074,
             "sichuan_dialect": 2062}
TINY_FRAMES = 50  # 4 s at 12.5 frames per second

_CONFIG = {
    "model_type": "qwen3_tts", "architectures": ["Qwen3TTSForConditionalGeneration"],
    "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": "1b7", "tts_model_type": "custom_voice",
    "im_start_token_id": 151644, "im_end_token_id": 151645, "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
    "talker_config": {
        "vocab_size": 3072, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": {"interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default", "type": "default"},
        "attention_bias": False, "num_code_groups": 16, "text_hidden_size": 48, "text_vocab_size": TEXT_VOCAB,
        "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155, "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
        "spk_id": SPEAKERS, "spk_is_dialect": {s: DIALECTS.get(s, False) for s in SPEAKERS},
        "codec_language_id": LANGUAGES,
        "code_predictor_config": {
            "vocab_size": 2048, "hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
            "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "attention_bias": False,
            "num_code_groups": 16,
        },
    },
    "speaker_encoder_config": {"enc_dim": 32, "sample_rate": 24000, "enc_channels": [32, 32, 32, 32, 96],
                               "enc_attention_channels": 16, "enc_res2net_scale": 4, "enc_se_channels": 16},
}
_CODEC = {  # speech_tokenizer/config.json's decoder part, tiny
    "codebook_size": 2048, "num_quantizers": 16, "hidden_size": 32, "latent_dim": 48, "codebook_dim": 24,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 64,
    "sliding_window": 72, "decoder_dim": 64, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
    "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01, "rope_theta": 10000, "max_position_embeddings": 8000,
}


def tiny_config(kind: str = "custom_voice") -> dict:
    """A config.json dict; `kind` is a tts_model_type. Base and VoiceDesign have no named speakers."""
    c = copy.deepcopy(_CONFIG)
    c["tts_model_type"] = kind
    if kind != "custom_voice":
        c["talker_config"]["spk_id"], c["talker_config"]["spk_is_dialect"] = {}, {}
    if kind != "base":
        c.pop("speaker_encoder_config")
    return c


def tiny_generation() -> dict:
    """generation_config.json of the preset: the reference's defaults, the reply capped at 4 s."""
    return {**DEFAULTS, "max_new_tokens": TINY_FRAMES + 1}


def tiny_codec() -> dict:
    return copy.deepcopy(_CODEC)


PRESETS = {"tiny-tts": lambda: tiny_config("custom_voice")}
