"""Block-scaled fp8 weights, the layout of Qwen's FP8 releases: a weight [..., out, in] stored as float8_e4m3fn
with a float32 `<key>_scale_inv` [..., ceil(out / b0), ceil(in / b1)]; the real weight is each fp8 value times
its (b0 x b1) block's scale. A checkpoint's fp8 weights load dequantized into the model's dtype, except MoE
experts that `fp8_experts_` keeps in fp8 (their matmul: fp8_moe.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import layers
from .config import ConfigError

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
BLOCK = (128, 128)
SCALE = "_scale_inv"  # checkpoint key suffix of a weight's block scales
SUPPORTED = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
PIECES = {"w13": 2, "w2": 1}  # an Experts weight's pieces, quantized apart: [gate | up], down


def block_size(q: object) -> tuple[int, int] | None:
    """The weight block size that config.json's `quantization_config` declares (None: not quantized);
    ConfigError in one line for a method, format, scheme or block size we do not read."""
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ConfigError("config.json: quantization_config is not an object")
    for key, want in SUPPORTED.items():
        got = q.get(key, None if key == "quant_method" else want)  # fmt and scheme default as transformers'
        if got != want:
            raise ConfigError(f"config.json: quantization_config {key} '{got}' is not supported "
                              f"(block-scaled fp8 only: {key} '{want}')")
    block = q.get("weight_block_size")
    if not (isinstance(block, list | tuple) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ConfigError(f"config.json: quantization_config weight_block_size {block!r} is not two positive ints")
    return (block[0], block[1])


def scale_shape(shape: torch.Size, block: tuple[int, int]) -> tuple[int, ...]:
    return (*shape[:-2], -(-shape[-2] // block[0]), -(-shape[-1] // block[1]))


def dequantize(w: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp8 `w` [..., out, in] times its blocks' scales, in float32."""
    rows, cols = w.shape[-2:]
    s = scale_inv.float().repeat_interleave(block[0], -2)[..., :rows, :].repeat_interleave(block[1], -1)
    return w.float() * s[..., :cols]


def quantize(w: torch.Tensor, block: tuple[int, int] = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, float32 scale_inv) of `w` [..., out, in]: each block's largest magnitude maps to FP8_MAX."""
    rows, cols = w.shape[-2:]
    padded = F.pad(w.float(), (0, -cols % block[1], 0, -rows % block[0]))
    blocks = padded.unflatten(-1, (-1, block[1])).unflatten(-3, (-1, block[0]))  # [..., R, b0, C, b1]
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = torch.where(amax > 0, amax / FP8_MAX, 1.0)
    q = (blocks / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.flatten(-2).flatten(-3, -2)[..., :rows, :cols].contiguous(), scale


def quantize_pieces(w: torch.Tensor, pieces: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` of `w` [..., rows, cols] cut into `pieces` of equal rows, each in blocks of its own; the pieces'
    scales one after the other."""
    q, scale = quantize(w.unflatten(-2, (pieces, -1)))
    return q.flatten(-3, -2), scale.flatten(-3, -2)


def fp8_experts_(model: nn.Module, empty: bool = False) -> None:
    """`--quantization fp8`: every MoE expert weight replaced by its fp8 e4m3 value with 128x128 block scales (gate and
    up quantized apart, as published; their scales one after the other in `<w>_scale_inv`), so the experts hold only fp8
    bytes and scales and run through fp8_moe. `empty`: only that storage is made (on the meta device for a model built
    there), for the loader to fill as it reads (weights.py): the experts are then never held in full precision."""
    experts = [m for m in model.modules() if isinstance(m, layers.Experts)]
    if not experts:
        raise ValueError("--quantization fp8 quantizes MoE experts, and this model has none")
    with torch.no_grad():
        for m in experts:
            for name, pieces in PIECES.items():
                w = getattr(m, name)
                scale = torch.empty(scale_shape(w.unflatten(-2, (pieces, -1)).shape, BLOCK), device=w.device)
                setattr(m, name, nn.Parameter(torch.empty(w.shape, dtype=FP8, device=w.device), requires_grad=False))
                m.register_buffer(name + SCALE, scale.flatten(-3, -2))
                if not empty:
                    store_(m, name, w)
    torch.cuda.empty_cache()  # the full-precision experts' memory counts as free when KV caches are sized


def store_(experts: layers.Experts, name: str, w: torch.Tensor) -> None:
    """Full-precision expert weights `w` [E, rows, cols] quantized, an expert at a time, into `experts`' fp8 `name`
    and its scales."""
    for e in range(w.shape[0]):
        getattr(experts, name)[e], getattr(experts, name + SCALE)[e] = quantize_pieces(w[e], PIECES[name])
