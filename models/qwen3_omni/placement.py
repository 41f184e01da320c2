"""Where Qwen3-Omni runs and how big its stages are: the pipeline config, and the KV caches' sizes.

`PipelineConfig.on(model, device)` gives the defaults for a device: on CUDA bf16, CUDA graphs, and KV
caches sized from the memory left after the weights; on CPU float32, eager, fixed small caches.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipelines.kv_cache import KVLayout
from pipelines.sampling import SamplingParams
from pipelines.stage import StageConfig

from .config import ConfigError
from .model import Qwen3Omni

log = logging.getLogger(__name__)
STAGE_NAMES = ("audio_encoder", "thinker", "talker", "code2wav")  # pipeline order, also the run order


def default_stages(device: str, graphs: bool = False) -> tuple[StageConfig, ...]:
    return (
        StageConfig("code2wav", device, max_batch=64, graphs=graphs),
        StageConfig("talker", device, max_batch=64, kv_blocks=2048, graphs=graphs, graph_context=4096),
        StageConfig("thinker", device, max_batch=64, kv_blocks=4096, graphs=graphs, graph_context=8192),
        StageConfig("audio_encoder", device, max_batch=16),
    )


@dataclass(frozen=True)
class PipelineConfig:
    """`model`: 'tiny' or a checkpoint directory. Each stage names its device and capacity.
    `kv_memory_gib`: on CUDA, size the thinker and talker caches to this much memory instead of their
    `kv_blocks` (`on()` sets it from the memory left after the weights)."""

    model: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    stages: tuple[StageConfig, ...] = field(default_factory=lambda: default_stages("cpu"))
    kv_memory_gib: float | None = None

    def __post_init__(self) -> None:
        names = sorted(s.name for s in self.stages)
        if names != sorted(STAGE_NAMES):
            raise ValueError(f"Qwen3-Omni needs stages {STAGE_NAMES}, got {names}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, not {self.dtype}")
        devices = {s.device for s in self.stages}
        if len(devices) > 1:
            raise ValueError(f"all stages must share one device for now (in-memory hand-over), got {devices}")

    def stage(self, name: str) -> StageConfig:
        return next(s for s in self.stages if s.name == name)

    @classmethod
    def on(cls, model: str, device: str, dtype: str | None = None, graphs: bool | None = None,
           kv_memory_gib: float | None = None, **stage_overrides: dict) -> PipelineConfig:
        """Defaults for `device`: on CUDA, bf16, CUDA graphs, and KV caches sized from free memory at start
        (`kv_memory_gib` None) unless a stage override gives `kv_blocks`."""
        cuda = device.startswith("cuda")
        graphs = cuda if graphs is None else graphs
        stages = tuple(
            StageConfig(**{**s.__dict__, **stage_overrides.get(s.name, {})}) for s in default_stages(device, graphs)
        )
        if cuda and kv_memory_gib is None and not any("kv_blocks" in o for o in stage_overrides.values()):
            kv_memory_gib = -1.0  # auto: from free memory once the weights are loaded
        return cls(model, device, dtype or ("bfloat16" if cuda else "float32"), stages, kv_memory_gib)


TYPICAL_SESSION_TOKENS = 2048  # a few turns of speech: what /health's session capacity counts in
KV_HEADROOM_GIB = 10.0  # left free for CUDA graphs, activations and Code2Wav stream state
TALKER_TOKEN_SHARE = 0.25  # talker cache tokens per thinker cache token, when sized from memory


def kv_layouts(model: Qwen3Omni, cfg: PipelineConfig) -> dict[str, KVLayout]:
    """The thinker's and talker's cache layouts: the stages' `kv_blocks`, or with `kv_memory_gib`, blocks
    that fill that much memory (negative: what is free on the device less KV_HEADROOM_GIB)."""
    texts = {"thinker": model.cfg.thinker.text, "talker": model.cfg.talker.text}
    itemsize = torch.empty((), dtype=getattr(torch, cfg.dtype)).element_size()
    per_token = {n: 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * itemsize for n, t in texts.items()}
    blocks = {n: cfg.stage(n).kv_blocks for n in texts}
    if cfg.kv_memory_gib is not None:
        gib = cfg.kv_memory_gib
        if gib < 0:
            gib = torch.cuda.mem_get_info(torch.device(cfg.device))[0] / 2**30 - KV_HEADROOM_GIB
        thinker_tokens = gib * 2**30 / (per_token["thinker"] + TALKER_TOKEN_SHARE * per_token["talker"])
        if thinker_tokens < 4096:
            raise ConfigError(f"{gib:.1f} GiB leaves no room for a KV cache of useful size")
        for name, tokens in (("thinker", thinker_tokens), ("talker", thinker_tokens * TALKER_TOKEN_SHARE)):
            blocks[name] = int(tokens) // cfg.stage(name).block_size
        log.info("KV cache: %.1f GiB, thinker %d tokens, talker %d tokens", gib,
                 blocks["thinker"] * cfg.stage("thinker").block_size, blocks["talker"] * cfg.stage("talker").block_size)
    return {
        n: KVLayout(t.num_hidden_layers, t.num_key_value_heads, t.head_dim, blocks[n], cfg.stage(n).block_size,
                    getattr(torch, cfg.dtype), cfg.device)
        for n, t in texts.items()
    }


def checkpoint_sampling(model: str) -> SamplingParams | None:
    """The thinker's sampling from the checkpoint's generation_config.json; None (greedy) without one."""
    path = Path(model) / "generation_config.json"
    if model == "tiny" or not path.exists():
        return None
    g = json.loads(path.read_text())
    if not g.get("do_sample"):
        return None
    return SamplingParams(
        temperature=float(g.get("temperature", 1.0)), top_k=int(g.get("top_k", 0) or 0),
        top_p=float(g.get("top_p", 1.0)), repetition_penalty=float(g.get("repetition_penalty", 1.0)),
    )
