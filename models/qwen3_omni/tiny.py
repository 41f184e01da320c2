"""Tiny Qwen3-Omni configs: the real structure and special ids, small sizes. "a" backs `--model tiny`; "b"
differs in every count (layers, heads, experts, windows) so that tests are not fitted to one shape."""

from __future__ import annotations

import copy
import json
from pathlib import Path

FULL_CONFIG = Path(__file__).parent / "configs" / "qwen3_omni_30b_a3b.json"

_SIZES = {
    "a": dict(
        audio=dict(encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                   downsample_hidden_size=16, output_dim=64),
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32),
        text_mrope=[4, 2, 2],
        talker=dict(thinker_hidden_size=64, accept_hidden_layer=2),
        talker_text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
                         moe_intermediate_size=16, shared_expert_intermediate_size=32),
        talker_mrope=[2, 1, 1],
        predictor=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8),
        code2wav=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=64, decoder_dim=64),
    ),
    "b": dict(
        audio=dict(encoder_layers=3, encoder_attention_heads=4, encoder_ffn_dim=96, d_model=48,
                   downsample_hidden_size=8, output_dim=96),
        text=dict(hidden_size=96, intermediate_size=64, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=3, head_dim=8, num_experts=16, num_experts_per_tok=4,
                  moe_intermediate_size=24),
        text_mrope=[2, 1, 1],
        talker=dict(thinker_hidden_size=96, accept_hidden_layer=1),
        talker_text=dict(hidden_size=48, intermediate_size=32, num_hidden_layers=3, num_attention_heads=6,
                         num_key_value_heads=2, head_dim=8, num_experts=6, num_experts_per_tok=3,
                         moe_intermediate_size=24, shared_expert_intermediate_size=40),
        talker_mrope=[2, 1, 1],
        predictor=dict(hidden_size=48, intermediate_size=48, num_hidden_layers=2, num_attention_heads=5,
                       num_key_value_heads=1, head_dim=8),
        code2wav=dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      intermediate_size=40, decoder_dim=48, sliding_window=3),
    ),
}

_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
               deepstack_visual_indexes=[0], num_position_embeddings=64)


def tiny_config(variant: str = "a") -> dict:
    """A config.json dict (transformers-5 form) for a tiny model."""
    if variant not in _SIZES:
        raise ValueError(f"unknown tiny variant '{variant}'; have {sorted(_SIZES)}")
    s = _SIZES[variant]
    c = copy.deepcopy(json.loads(FULL_CONFIG.read_text()))
    th, tk = c["thinker_config"], c["talker_config"]
    th["audio_config"].update(s["audio"])
    th["vision_config"].update(_VISION, out_hidden_size=s["text"]["hidden_size"])
    th["text_config"].update(s["text"])
    th["text_config"]["rope_parameters"]["mrope_section"] = s["text_mrope"]
    tk.update(s["talker"])
    tk["text_config"].update(s["talker_text"])
    tk["text_config"]["rope_parameters"]["mrope_section"] = s["talker_mrope"]
    tk["code_predictor_config"].update(s["predictor"])
    c["code2wav_config"].update(s["code2wav"])
    return c


def thinker_only(config: dict) -> dict:
    """The same config without a talker: the layout of the Thinking and Captioner checkpoints."""
    c = copy.deepcopy(config)
    for key in ("talker_config", "code2wav_config"):
        c.pop(key, None)
    c["enable_audio_output"] = False
    return c


PRESETS = {"tiny": lambda: tiny_config("a"), "tiny-thinker": lambda: thinker_only(tiny_config("a"))}
