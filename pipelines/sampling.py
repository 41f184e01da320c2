"""Batched token sampling on the device, without host syncs.

Randomness is counter based (seed, step, token index hashed to a uniform) and drawn by the Gumbel-max rule, so a row's
draw does not depend on its batch. Order as the reference: repetition penalty, suppressed ids, temperature, top-k,
top-p. Top-k keeps every logit equal to the k-th (as transformers' warper does), and top-p keeps or drops logits of one
value together (the mass strictly above a logit decides).

On CUDA, vocabularies up to FUSED_MAX_VOCAB are sampled by one Triton kernel a step (sampling_kernel.py) instead of ~17
torch kernels and a full sort; larger ones take torch's path."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np
import torch

from .graphs import Input, Tensors


@dataclass(frozen=True)
class SamplingParams:
    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature <= 0 and not self.greedy:
            raise ValueError("temperature must be > 0 (use greedy=True for argmax)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0 or self.repetition_penalty <= 0:
            raise ValueError("top_k must be >= 0 and repetition_penalty > 0")


# Sampler's per-row fields: dtype, and the value a padding row gets.
FIELDS = {"greedy": (torch.bool, True), "temperature": (torch.float32, 1.0), "top_k": (torch.long, 0),
          "top_p": (torch.float32, 1.0), "penalty": (torch.float32, 1.0), "seed": (torch.long, 0)}
_MASK32 = 0xFFFFFFFF
HAVE_TRITON = importlib.util.find_spec("triton") is not None
FUSED = True  # tests and benchmarks switch the kernel off to compare
FUSED_MAX_VOCAB = 8192


def row_values(params: list[SamplingParams]) -> dict[str, list]:
    """Each of FIELDS per row (a greedy row's temperature is 1: it is never divided by)."""
    return {
        "greedy": [p.greedy for p in params],
        "temperature": [1.0 if p.greedy else p.temperature for p in params],
        "top_k": [p.top_k for p in params], "top_p": [p.top_p for p in params],
        "penalty": [p.repetition_penalty for p in params], "seed": [p.seed for p in params],
    }


def uniform(seed: torch.Tensor, step: torch.Tensor, n: int) -> torch.Tensor:
    """[B, n] uniforms in (0, 1) from integer seeds and steps [B] (a small integer hash)."""
    idx = torch.arange(n, device=seed.device, dtype=torch.long)
    x = (seed[:, None] * 0x9E3779B1 + step[:, None] * 0x7FEB352D + idx[None, :] * 0x2C1B3C6D) & _MASK32
    for _ in range(3):
        x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK32
    return ((x >> 8).float() + 0.5) / float(1 << 24)


def gumbel_noise(seed: torch.Tensor, steps: torch.Tensor, n: int) -> torch.Tensor:
    """[B, S, n] Gumbel noise for rows with seeds [B] at sampling counters steps [B, S]."""
    b, s = steps.shape
    u = uniform(seed[:, None].expand(b, s).reshape(-1), steps.reshape(-1), n)
    return (-torch.log(-torch.log(u))).view(b, s, n)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """seen: [B, V] bool; penalty: [B]. Seen logits > 0 are divided by it, others multiplied."""
    p = penalty[:, None].to(logits.dtype)
    scaled = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, scaled, logits)


def top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (-inf) all but each row's top_k (0: all; with the logits equal to the k-th) and its top_p nucleus:
    the logits with less than top_p of the mass strictly above them (so the top one always stays)."""
    v = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where((top_k > 0) & (top_k < v), top_k, v)[:, None]
    sorted_logits = sorted_logits.masked_fill(sorted_logits < sorted_logits.gather(-1, k - 1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    first = torch.ones_like(sorted_logits, dtype=torch.bool)
    first[:, 1:] = sorted_logits[:, 1:] != sorted_logits[:, :-1]  # where a run of equal logits starts
    above = torch.where(first, mass_before, 0.0).cummax(dim=-1).values  # its run's first mass_before
    drop = (above >= top_p[:, None]) & (top_p[:, None] < 1)
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


@dataclass
class Sampler:
    """Per-row parameters as [B] device tensors. `any_penalty`, `all_greedy`: host shortcuts (a captured step
    keeps the defaults, the full path)."""

    greedy: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    penalty: torch.Tensor
    seed: torch.Tensor
    any_penalty: bool = True
    all_greedy: bool = False

    @classmethod
    def of(cls, params: list[SamplingParams], device: torch.device | str) -> Sampler:
        """Packed once per batch composition from the rows' parameters."""
        values = row_values(params)
        tensors = (torch.tensor(values[k], dtype=dt, device=device) for k, (dt, _) in FIELDS.items())
        return cls(*tensors, any(p.repetition_penalty != 1.0 for p in params), all(p.greedy for p in params))

    def __call__(self, logits: torch.Tensor, step: torch.Tensor, seen: torch.Tensor | None = None,
                 suppress: torch.Tensor | None = None) -> torch.Tensor:
        """logits [B, V] -> ids [B]. step [B]: the row's sampling counter; seen [B, V] bool (the repetition
        penalty's ids); suppress: [V] or [B, V] bool."""
        if self.fused(logits):
            return self.fused_call(logits, step, seen if self.any_penalty else None, suppress)
        logits = logits.float()
        if seen is not None and self.any_penalty:
            logits = apply_repetition_penalty(logits, seen, self.penalty)
        if suppress is not None:
            logits = logits.masked_fill(suppress if suppress.dim() == 2 else suppress[None, :], float("-inf"))
        greedy_ids = logits.argmax(dim=-1)
        if self.all_greedy:
            return greedy_ids
        scaled = top_k_top_p(logits / self.temperature[:, None], self.top_k, self.top_p)
        sampled = (scaled + gumbel_noise(self.seed, step[:, None], logits.shape[-1])[:, 0]).argmax(dim=-1)
        return torch.where(self.greedy, greedy_ids, sampled)

    def fused(self, logits: torch.Tensor) -> bool:
        return (FUSED and HAVE_TRITON and logits.is_cuda and logits.dim() == 2 and logits.stride(-1) == 1
                and logits.shape[-1] <= FUSED_MAX_VOCAB and not torch.is_grad_enabled())

    def fused_call(self, logits: torch.Tensor, step: torch.Tensor, seen: torch.Tensor | None,
                   suppress: torch.Tensor | None) -> torch.Tensor:
        from . import sampling_kernel as K

        b, v = logits.shape
        out = torch.empty(b, dtype=torch.long, device=logits.device)
        if suppress is not None and suppress.dim() == 1:
            suppress = suppress[None, :].expand(b, v)
        for t in (seen, suppress):
            if t is not None and t.stride(-1) != 1:
                raise ValueError("seen and suppress need unit stride over the vocabulary")
        block = 1 << (v - 1).bit_length()
        if b:
            K.sample_rows[(b,)](
                logits, logits.stride(0), v, logits if seen is None else seen, 0 if seen is None else seen.stride(0),
                self.penalty, logits if suppress is None else suppress, 0 if suppress is None else suppress.stride(0),
                self.greedy, self.temperature, self.top_k, self.top_p, self.seed, step, step.stride(0), out,
                HAS_SEEN=seen is not None, HAS_SUPPRESS=suppress is not None, BLOCK=block,
                num_warps=min(max(block // 512, 1), 8), enable_fp_fusion=False)
        return out


def sampling_inputs(prefix: str) -> dict[str, Input]:
    """Sampling parameters as static step inputs. A captured step cannot branch on them on the host, so its
    sampler always runs the full path; each row's result equals `Sampler.of(params)`'s."""
    return {f"{prefix}.{k}": Input((), dt, pad) for k, (dt, pad) in FIELDS.items()}


def sampling_rows(prefix: str, params: list[SamplingParams]) -> dict[str, np.ndarray]:
    return {f"{prefix}.{k}": np.asarray(v) for k, v in row_values(params).items()}


def static_sampler(buffers: Tensors, prefix: str) -> Sampler:
    """A Sampler over the step's buffers (no host-side shortcuts)."""
    return Sampler(*(buffers[f"{prefix}.{k}"] for k in FIELDS))
