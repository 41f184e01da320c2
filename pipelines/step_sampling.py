"""Sampling parameters as static step inputs. A captured step cannot branch on them on the host, so its
sampler always runs the full path; each row's result equals `Sampler.of(params)`'s."""

from __future__ import annotations

import numpy as np

from .graphs import Input, Tensors
from .sampling import FIELDS, Sampler, SamplingParams, row_values


def sampling_inputs(prefix: str) -> dict[str, Input]:
    return {f"{prefix}.{k}": Input((), dt, pad) for k, (dt, pad) in FIELDS.items()}


def sampling_rows(prefix: str, params: list[SamplingParams]) -> dict[str, np.ndarray]:
    return {f"{prefix}.{k}": np.asarray(v) for k, v in row_values(params).items()}


def static_sampler(buffers: Tensors, prefix: str) -> Sampler:
    """A Sampler over the step's buffers (no host-side shortcuts)."""
    return Sampler(*(buffers[f"{prefix}.{k}"] for k in FIELDS))
