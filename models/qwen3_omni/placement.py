"""Where Qwen3-Omni runs and how big its stages are: the pipeline config, and the KV caches' sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from models.common.gpu_memory import kv_tokens
from pipelines.kv_cache import KVLayout
from pipelines.stage import StageConfig

from .model import Qwen3Omni

STAGE_NAMES = ("audio_encoder", "thinker", "talker", "code2wav")  # pipeline order, also the run order
TEXT_STAGES = STAGE_NAMES[:2]  # a checkpoint without a talker


def default_stages(device: str, graphs: bool = False) -> tuple[StageConfig, ...]:
    return (StageConfig("code2wav", device, max_batch=64, graphs=graphs),
            StageConfig("talker", device, max_batch=64, kv_blocks=2048, graphs=graphs, graph_context=4096,
                        decode_after_prefill=True),
            StageConfig("thinker", device, max_batch=64, kv_blocks=4096, graphs=graphs, graph_context=8192,
                        overlap=True, decode_after_prefill=True),
            StageConfig("audio_encoder", device, max_batch=16, graphs=graphs))


@dataclass(frozen=True)
class PipelineConfig:
    """`model`: a preset or a checkpoint directory. `kv_memory_gib`: see `kv_layouts`."""

    model: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    stages: tuple[StageConfig, ...] = field(default_factory=lambda: default_stages("cpu"))
    kv_memory_gib: float | None = None

    def __post_init__(self) -> None:
        names = {s.name for s in self.stages}
        if not set(TEXT_STAGES) <= names or not names <= set(STAGE_NAMES):
            raise ValueError(f"Qwen3-Omni needs stages {TEXT_STAGES} (and {STAGE_NAMES[2:]} to speak), "
                             f"got {sorted(names)}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, not {self.dtype}")
        devices = {s.device for s in self.stages}
        if len(devices) > 1:
            raise ValueError(f"all stages must share one device for now (in-memory hand-over), got {devices}")

    def stage_names(self, speaks: bool) -> tuple[str, ...]:
        if speaks and not set(STAGE_NAMES) <= {s.name for s in self.stages}:
            raise ValueError(f"a model that speaks needs stages {STAGE_NAMES}")
        return STAGE_NAMES if speaks else TEXT_STAGES

    def stage(self, name: str) -> StageConfig:
        return next(s for s in self.stages if s.name == name)

    @classmethod
    def on(cls, model: str, device: str, dtype: str | None = None, graphs: bool | None = None,
           kv_memory_gib: float | None = None, **stage_overrides: dict) -> PipelineConfig:
        """Defaults for `device`: on CUDA bf16, CUDA graphs, and KV caches sized from free memory (unless a
        stage override gives `kv_blocks`); on CPU float32, eager, small fixed caches."""
        cuda = device.startswith("cuda")
        graphs = cuda if graphs is None else graphs
        stages = tuple(StageConfig(**{**s.__dict__, **stage_overrides.get(s.name, {})})
                       for s in default_stages(device, graphs))
        if cuda and kv_memory_gib is None and not any("kv_blocks" in o for o in stage_overrides.values()):
            kv_memory_gib = -1.0  # auto: from free memory once the weights are loaded
        dtype = dtype or ("bfloat16" if cuda else "float32")
        return cls(model, device, dtype, stages, kv_memory_gib)


KV_HEADROOM_GIB = 12.0  # left free for CUDA graphs (a pool per stage), activations and Code2Wav stream state
TALKER_TOKEN_SHARE = 0.25  # talker cache tokens per thinker cache token, when sized from memory


def kv_layouts(model: Qwen3Omni, cfg: PipelineConfig) -> dict[str, KVLayout]:
    """The thinker's and talker's cache layouts: the stages' `kv_blocks`, or with `kv_memory_gib`, blocks
    that fill that much memory (negative: what is free on the device, within --gpu-memory-gib, less KV_HEADROOM_GIB)."""
    texts = {"thinker": model.cfg.thinker.text}
    if model.talker is not None:  # None also when another model's voice speaks
        texts["talker"] = model.cfg.talker.text
    blocks = {n: cfg.stage(n).kv_blocks for n in texts}
    if cfg.kv_memory_gib is not None:
        share = {n: 1.0 if n == "thinker" else TALKER_TOKEN_SHARE for n in texts}
        tokens = kv_tokens(cfg.kv_memory_gib, KV_HEADROOM_GIB, cfg.device, texts, getattr(torch, cfg.dtype), share)
        blocks = {n: tokens[n] // cfg.stage(n).block_size for n in texts}
    return {n: KVLayout(t.num_hidden_layers, t.num_key_value_heads, t.head_dim, blocks[n], cfg.stage(n).block_size,
                        getattr(torch, cfg.dtype), cfg.device) for n, t in texts.items()}
