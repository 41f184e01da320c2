"""`--gpu-memory-gib`: a cap on what this process takes of a CUDA device, and what it leaves (for the KV caches)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from .config import ConfigError, TextConfig

log = logging.getLogger(__name__)


def _index(device: str | torch.device) -> int:
    dev = torch.device(device)
    return torch.cuda.current_device() if dev.index is None else dev.index


def cap(device: str, gib: float) -> None:
    """Limit torch's allocations on CUDA `device` (weights, KV caches, CUDA graphs, activations) to `gib` GiB (beyond
    it: torch's out-of-memory error); ValueError in one line off CUDA, or for a cap the device does not have."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"--gpu-memory-gib caps CUDA memory, and the model runs on {device}: leave it out")
    total = torch.cuda.get_device_properties(_index(device)).total_memory / 2**30
    if not 0 < gib <= total:
        raise ValueError(f"--gpu-memory-gib {gib:g}: give more than 0 and at most {device}'s {total:.1f} GiB")
    torch.cuda.set_per_process_memory_fraction(gib / total, _index(device))


def free_gib(device: str | torch.device) -> float:
    """GiB this process may still take on CUDA `device`: what the device has free, within the cap (blocks torch
    keeps cached, e.g. from loading, are released first)."""
    i = _index(device)
    torch.cuda.empty_cache()
    capped = torch.cuda.get_per_process_memory_fraction(i) * torch.cuda.get_device_properties(i).total_memory
    return min(torch.cuda.mem_get_info(i)[0], capped - torch.cuda.memory_reserved(i)) / 2**30


def check_fits(model: nn.Module, device: str | torch.device, dtype: torch.dtype) -> None:
    """Before a meta-built model is filled on `device`: one line when its weights (in `dtype`, fp8 ones in fp8)
    alone need more than the process may still take there."""
    if torch.device(device).type != "cuda":
        return
    need = sum(p.numel() * min(p.dtype.itemsize, dtype.itemsize) for p in model.parameters()) / 2**30
    if need > (free := free_gib(device)):
        raise ValueError(f"the weights alone need {need:.1f} GiB and {device} has {free:.1f} GiB free "
                         "(within --gpu-memory-gib, if given): give more, or --quantization fp8 for MoE experts")


def kv_tokens(gib: float, headroom_gib: float, device: str, texts: dict[str, TextConfig], dtype: torch.dtype,
              share: dict[str, float]) -> dict[str, int]:
    """Cache tokens for each named decoder's KV in `gib` GiB (negative: what `device` has free within the cap, less
    `headroom_gib`), `share[name]` tokens for each of the first's; one line (ConfigError) under 4,096 of them."""
    gib = free_gib(device) - headroom_gib if gib < 0 else gib
    per_token = {n: 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * dtype.itemsize
                 for n, t in texts.items()}
    first = gib * 2**30 / sum(share[n] * per_token[n] for n in texts)
    if first < 4096:
        raise ConfigError(f"{gib:.1f} GiB leaves no room for a KV cache of useful size (when not given: what the "
                          f"weights leave free within --gpu-memory-gib, less {headroom_gib:g} GiB)")
    tokens = {n: int(first * share[n]) for n in texts}
    log.info("KV cache: %.1f GiB, %s", gib, ", ".join(f"{n} {t} tokens" for n, t in tokens.items()))
    return tokens
