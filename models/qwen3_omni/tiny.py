"""Tiny Qwen3-Omni configs: the real structure and special ids, small sizes. "a" backs `--model tiny`; "b"
differs in every count (layers, heads, experts, windows) so that tests are not fitted to one shape."""

from __future__ import annotations

import copy
import json
from pathlib import Path

FULL_CONFIG = Path(__file__).parent / "configs" / "qwen3_omni_30b_a3b.json"
TINY_SIZES = Path(__file__).parent / "configs" / "tiny_sizes.json"  # per variant, the sizes that differ from FULL


def tiny_config(variant: str = "a") -> dict:
    """A config.json dict (transformers-5 form) for a tiny model."""
    sizes = json.loads(TINY_SIZES.read_text())
    vision = sizes.pop("vision")
    if variant not in sizes:
        raise ValueError(f"unknown tiny variant '{variant}'; have {sorted(sizes)}")
    s = sizes[variant]
    c = json.loads(FULL_CONFIG.read_text())
    th, tk = c["thinker_config"], c["talker_config"]
    th["audio_config"].update(s["audio"])
    th["vision_config"].update(vision, out_hidden_size=s["text"]["hidden_size"])
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
    drop = ("talker_config", "code2wav_config")
    return {**{k: copy.deepcopy(v) for k, v in config.items() if k not in drop}, "enable_audio_output": False}


PRESETS = {"tiny": lambda: tiny_config("a"), "tiny-thinker": lambda: thinker_only(tiny_config("a"))}
