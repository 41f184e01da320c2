"""Which model folder serves a checkpoint: by config.json's `model_type` ('tiny' is Qwen3-Omni's preset)."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.pipeline import Pipeline

SUPPORTED = ("qwen3_omni_moe",)


def model_type(model: str) -> str:
    if model == "tiny":
        return "qwen3_omni_moe"
    path = Path(model) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{model}: not 'tiny' and no config.json there")
    kind = json.loads(path.read_text()).get("model_type", "")
    if kind not in SUPPORTED:
        raise ValueError(f"{model}: model_type '{kind}' is not supported (supported: {', '.join(SUPPORTED)})")
    return kind


def build_pipeline(model: str, device: str = "cpu", dtype: str | None = None, graphs: bool | None = None,
                   kv_memory_gib: float | None = None, **stage_overrides: dict) -> Pipeline:
    """Load `model` and return its (not yet started) Pipeline. `graphs` None: CUDA graphs on CUDA;
    `kv_memory_gib` None: on CUDA, KV caches from the memory left after the weights."""
    model_type(model)
    from models.qwen3_omni.placement import PipelineConfig
    from models.qwen3_omni.program import build_pipeline as build_qwen3_omni

    return build_qwen3_omni(PipelineConfig.on(model, device, dtype, graphs, kv_memory_gib, **stage_overrides))
