"""Which model folder serves a checkpoint (by config.json's `model_type`) or a tiny preset. Adding a model is
one entry in MODELS; nothing else outside its folder names it. A model that writes text replies can speak them
with another model's voice (pipelines/voice.py): `build_pipeline(model, voice_model=...)`."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from models.common.fused import use_triton
from models.common.gpu_memory import cap
from pipelines.pipeline import Pipeline
from pipelines.spec import ModelSpec
from pipelines.voice import spoken_by


@dataclass(frozen=True)
class Entry:
    model_type: str  # config.json's model_type
    presets: tuple[str, ...]  # tiny random-weight presets, served without files
    builder: str  # "module:function" building the Pipeline (imported only when used; takes `voice` if text_out)
    describer: str  # "module:function" giving the ModelSpec from the config alone, before any weights load
    voice: str = ""  # "module:function" building its Voice for another model's replies; "" if it is none


MODELS = (
    Entry("qwen3_omni_moe", ("tiny", "tiny-thinker"), "models.qwen3_omni.program:build",
          "models.qwen3_omni.spec:describe"),
    Entry("qwen3_tts", ("tiny-tts",), "models.qwen3_tts.program:build", "models.qwen3_tts.spec:describe",
          "models.qwen3_tts.voice:build_voice"))


def presets() -> tuple[str, ...]:
    return tuple(p for e in MODELS for p in e.presets)


def entry(model: str) -> Entry:
    """The entry serving `model` (a preset name or a checkpoint directory); one-line errors otherwise."""
    for e in MODELS:
        if model in e.presets:
            return e
    path = Path(model) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model}: not a preset ({', '.join(presets())}) and no config.json there")
    try:
        kind = json.loads(path.read_text()).get("model_type", "")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ValueError(f"{path}: not a JSON config ({e})") from None
    for e in MODELS:
        if e.model_type == kind:
            return e
    supported = ", ".join(e.model_type for e in MODELS)
    raise ValueError(f"{model}: model_type '{kind}' is not supported (supported: {supported})")


def model_type(model: str) -> str:
    return entry(model).model_type


def _load(target: str):
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def describe(model: str, voice_model: str = "") -> ModelSpec:
    """What `model` (speaking with `voice_model`'s voice, if given) declares, from the configs alone; ValueError
    (or OSError) for a config that cannot be read or a pair that cannot be composed."""
    spec = _load(entry(model).describer)(model)
    if not voice_model:
        return spec
    if not entry(voice_model).voice:
        raise ValueError("this model cannot be another model's voice")
    if not spec.text_out:
        raise ValueError(f"the model {model} writes no text replies for a voice to read")
    return spoken_by(spec, _load(entry(voice_model).describer)(voice_model))


def build_pipeline(model: str, device: str = "cpu", dtype: str | None = None, graphs: bool | None = None,
                   kv_memory_gib: float | None = None, voice_model: str = "", quantization: str | None = None,
                   gpu_memory_gib: float | None = None, triton: bool = True, **stage_overrides: dict) -> Pipeline:
    """`model`'s Pipeline, not started. `graphs` None: on CUDA; `kv_memory_gib` None: on CUDA, what the weights
    leave. `voice_model` (loaded first, so `model`'s caches take the memory left) speaks `model`'s replies.
    `quantization` "fp8": MoE experts quantized as they load. `gpu_memory_gib`: the process's cap on CUDA (the KV
    caches take what it leaves). `triton` False: torch's kernels, not ours (process-wide)."""
    if quantization not in (None, "fp8"):
        raise ValueError(f"quantization '{quantization}' is not supported (fp8 only)")
    if gpu_memory_gib is not None:
        cap(device, gpu_memory_gib)
    use_triton(triton)
    voice = {}
    if voice_model:
        describe(model, voice_model)
        voice["voice"] = _load(entry(voice_model).voice)(voice_model, device, dtype, graphs)
    return _load(entry(model).builder)(model, device, dtype, graphs, kv_memory_gib, quantization=quantization, **voice,
                                       **stage_overrides)
