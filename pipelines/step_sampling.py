"""Sampling parameters as static step inputs: per-row values written by `prepare`, read on the device.

A captured step cannot branch on the batch's parameters on the host, so the sampler built here always
runs the full path (penalty, temperature, top-k/top-p, Gumbel draw) and picks argmax rows by mask;
the result per row equals `Sampler.of(params)` on the same logits.
"""

from __future__ import annotations

import numpy as np
import torch

from .graphs import Input, Tensors
from .sampling import Sampler, SamplingParams

_FIELDS = {
    "greedy": (torch.bool, True), "temperature": (torch.float32, 1.0), "top_k": (torch.long, 0),
    "top_p": (torch.float32, 1.0), "penalty": (torch.float32, 1.0), "seed": (torch.long, 0),
}


def sampling_inputs(prefix: str) -> dict[str, Input]:
    return {f"{prefix}.{k}": Input((), dt, pad) for k, (dt, pad) in _FIELDS.items()}


def sampling_rows(prefix: str, params: list[SamplingParams]) -> dict[str, np.ndarray]:
    values = {
        "greedy": [p.greedy for p in params],
        "temperature": [1.0 if p.greedy else p.temperature for p in params],
        "top_k": [p.top_k for p in params], "top_p": [p.top_p for p in params],
        "penalty": [p.repetition_penalty for p in params], "seed": [p.seed for p in params],
    }
    return {f"{prefix}.{k}": np.asarray(v) for k, v in values.items()}


def static_sampler(buffers: Tensors, prefix: str) -> Sampler:
    """A Sampler over the step's buffers (no host-side shortcuts)."""
    return Sampler(*(buffers[f"{prefix}.{k}"] for k in _FIELDS))
