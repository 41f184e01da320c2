"""Qwen3-Omni's checkpoint names: all ours as they are, except the vision tower's (image and video input
are not served yet), which is skipped without being read. The loader itself is models/common/weights.py."""

from __future__ import annotations

from functools import partial

from models.common.weights import load_weights as load_any

VISION_PREFIX = "thinker.visual."


def omni_name(key: str) -> str | None:
    return None if key.startswith(VISION_PREFIX) else key


load_weights = partial(load_any, rename=omni_name)
