"""Checkpoint loading: stream safetensors shards into a model built on the meta device.

Every checkpoint tensor (an fp8 one times its block scales, unless the model holds it in fp8: fp8.py) lands in exactly
one parameter (or one slice of a fused or stacked one: _RULES) or is skipped, unread: outside the prefix asked for, or
dropped by the model's `rename` (None). Every parameter must be filled. Anything else is an error naming the keys."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from . import fp8

# checkpoint key -> the key in our module tree (before _RULES), or None to skip the tensor
Rename = Callable[[str], str | None]


def same_name(key: str) -> str | None:
    return key


class WeightError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    name: str
    index: int | None = None  # expert index into a stacked parameter
    part: int = 0  # which piece of a fused dimension-0 concatenation
    parts: tuple[str, ...] = ()  # names of the pieces, in order (for sizes)


GATE_UP = ("gate", "up")
_RULES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], Target]]] = [
    (re.compile(r"^(.*\.self_attn)\.([qkv])_proj\.(weight|bias)$"),
     lambda m: Target(f"{m[1]}.qkv.{m[3]}", part="qkv".index(m[2]), parts=("q", "k", "v"))),
    (re.compile(r"^(.*\.experts)\.(\d+)\.(gate|up)_proj\.weight$"),
     lambda m: Target(f"{m[1]}.w13", index=int(m[2]), part=GATE_UP.index(m[3]), parts=GATE_UP)),
    (re.compile(r"^(.*\.experts)\.(\d+)\.down_proj\.weight$"), lambda m: Target(f"{m[1]}.w2", index=int(m[2]))),
    (re.compile(r"^(.*\.experts)\.gate_up_proj$"), lambda m: Target(f"{m[1]}.w13")),
    (re.compile(r"^(.*\.experts)\.down_proj$"), lambda m: Target(f"{m[1]}.w2")),
    (re.compile(r"^(.*\.(?:mlp|shared_expert))\.(gate|up)_proj\.weight$"),
     lambda m: Target(f"{m[1]}.gate_up.weight", part=GATE_UP.index(m[2]), parts=GATE_UP)),
]


def map_name(ckpt: str) -> Target:
    for pattern, target in _RULES:
        if m := pattern.match(ckpt):
            return target(m)
    return Target(ckpt)


def checkpoint_files(path: str | Path) -> list[Path]:
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / s for s in shards]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightError(f"no safetensors files in {path}")
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise WeightError(f"shards named by the index are missing: {missing}")
    return files


def checkpoint_block(path: str | Path) -> tuple[int, int] | None:
    """The fp8 block size config.json's quantization_config gives (fp8.py), None when it has none."""
    config = Path(path) / "config.json"
    return fp8.block_size(json.loads(config.read_text()).get("quantization_config") if config.is_file() else None)


def iter_tensors(path: str | Path, rename: Rename,
                 prefix: str) -> Iterator[tuple[str, str, torch.Tensor, torch.Tensor | None]]:
    """(checkpoint key, renamed key less `prefix`, tensor as stored, its fp8 block scales or None) of every
    tensor kept; the others are not read."""
    block = checkpoint_block(path)
    with ExitStack() as stack:
        files = [stack.enter_context(safe_open(str(f), framework="pt")) for f in checkpoint_files(path)]
        shard = {key: st for st in files for key in st.keys()}  # noqa: SIM118 (safe_open is not a dict)
        scales = {k + fp8.SCALE for k in shard} & shard.keys()  # read with their weight
        for key, st in shard.items():
            name = rename(key)
            if name is None or not name.startswith(prefix) or key in scales:
                continue
            tensor = st.get_tensor(key)
            yield key, name[len(prefix) :], tensor, _scale(key, tensor, shard, block)


def _scale(key: str, tensor: torch.Tensor, shard: dict, block: tuple[int, int] | None) -> torch.Tensor | None:
    """The block scales `key`_scale_inv of an fp8 `tensor` (None for another), checked against its shape."""
    scale_key = key + fp8.SCALE
    if scale_key not in shard and not str(tensor.dtype).startswith("torch.float8"):
        return None
    if tensor.dtype != fp8.FP8:
        raise WeightError(f"{key}: {tensor.dtype} {'with block scales ' if scale_key in shard else ''}is not read "
                          "(of 8-bit weights, block-scaled float8_e4m3fn only)")
    if scale_key not in shard:
        raise WeightError(f"{key}: float8_e4m3fn without its block scales {scale_key}")
    if block is None:
        raise WeightError(f"{key}: float8_e4m3fn, but config.json has no quantization_config giving its block size")
    scale = shard[scale_key].get_tensor(scale_key)
    if tuple(scale.shape) != fp8.scale_shape(tensor.shape, block):
        raise WeightError(f"{scale_key}: shape {tuple(scale.shape)}, but {key} {tuple(tensor.shape)} in "
                          f"{block[0]}x{block[1]} blocks needs {fp8.scale_shape(tensor.shape, block)}")
    return scale


def _fused_offset(target: Target, dest: torch.Tensor, piece: torch.Tensor) -> int:
    """Row offset of `piece` in a fused parameter: [q | k | v] with equal k and v, or [gate | up]."""
    if target.parts == ("q", "k", "v") and target.part:
        q_rows = dest.shape[0] - 2 * piece.shape[0]
        return q_rows + (target.part - 1) * piece.shape[0]
    return target.part * piece.shape[0]


def load_weights(model: nn.Module, path: str | Path, prefix: str = "", device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, rename: Rename = same_name) -> None:
    """Fill `model` from the checkpoint at `path`; `prefix` (applied after `rename`) selects a part of the
    checkpoint and is stripped. A parameter the model holds in fp8 (fp8.fp8_experts_ with `empty`) is filled as
    stored when the checkpoint has it in fp8 128x128 blocks, else quantized from `dtype` tensor by tensor.
    Raises WeightError naming missing, unexpected or mis-shaped keys."""
    params = dict(model.named_parameters())
    block = checkpoint_block(path)
    filled: dict[str, torch.Tensor] = {}
    covered: dict[str, int] = {}
    unexpected, bad_shape = [], []
    for key, name, tensor, scale in iter_tensors(path, rename, prefix):
        target = map_name(name)
        if target.name not in params:
            unexpected.append(key)
            continue
        param = params[target.name]
        buf = filled.get(target.name)
        if buf is None:
            kind = param.dtype if param.dtype == fp8.FP8 else dtype
            buf = filled[target.name] = torch.empty(param.shape, dtype=kind, device=device)
        dest = buf if target.index is None else buf[target.index]
        if target.parts:
            if tensor.dim() != dest.dim() or tensor.shape[1:] != dest.shape[1:] or tensor.shape[0] > dest.shape[0]:
                bad_shape.append(f"{key}: checkpoint {tuple(tensor.shape)} does not fit {tuple(dest.shape)}")
                continue
            off = _fused_offset(target, dest, tensor)
            dest = dest[off : off + tensor.shape[0]]
        if dest.shape != tensor.shape:
            bad_shape.append(f"{key}: checkpoint {tuple(tensor.shape)}, model {target.name} {tuple(dest.shape)}")
            continue
        pieces = 2 if target.name.endswith(".w13") and not target.parts else 1  # experts' [gate | up] in one
        if scale is not None and not (buf.dtype == fp8.FP8 and block == fp8.BLOCK and pieces == 1):
            tensor, scale = fp8.dequantize(tensor.to(device), scale.to(device), block), None
        if buf.dtype == fp8.FP8:
            _fill_fp8(model, filled, target, dest, tensor, scale, pieces, dtype)
        else:
            dest.copy_(tensor.to(dtype))
        covered[target.name] = covered.get(target.name, 0) + tensor.numel()
    missing = [n for n, p in params.items() if covered.get(n, 0) != p.numel()]
    problems = []
    if bad_shape:
        problems.append("wrong shape: " + _some(bad_shape, "; "))
    if unexpected:
        problems.append(f"unexpected keys (no such parameter under '{prefix}'): " + _some(sorted(unexpected)))
    if missing:
        partial = [f"{n} ({covered.get(n, 0)}/{params[n].numel()} elements)" for n in missing]
        problems.append("missing keys (parameters not filled): " + _some(sorted(partial)))
    if problems:
        raise WeightError(f"checkpoint {path} does not match the model:\n  " + "\n  ".join(problems))
    for name, tensor in filled.items():
        _set_param(model, name, tensor)


def _fill_fp8(model: nn.Module, filled: dict[str, torch.Tensor], target: Target, dest: torch.Tensor,
              tensor: torch.Tensor, scale: torch.Tensor | None, pieces: int, dtype: torch.dtype) -> None:
    """`tensor` into the fp8 `dest` and its share of the scales: as stored if it is fp8 (`scale`), else quantized
    from `dtype` in `pieces` (the same bytes as loading in `dtype`, then fp8.fp8_experts_)."""
    if scale is None:
        tensor, scale = fp8.quantize_pieces(tensor.to(dest.device, dtype), pieces)
    scales = filled.get(target.name + fp8.SCALE)
    if scales is None:
        shape = model.get_buffer(target.name + fp8.SCALE).shape
        scales = filled[target.name + fp8.SCALE] = torch.empty(shape, device=dest.device)
    if target.index is not None:
        scales = scales[target.index]
    if target.parts:
        scales = scales[target.part * scale.shape[-2] : (target.part + 1) * scale.shape[-2]]
    dest.copy_(tensor)
    scales.copy_(scale)


def _some(names: list[str], sep: str = ", ", shown: int = 20) -> str:
    """The first `shown` of a list of keys, and how many more (a mismatched checkpoint has thousands)."""
    more = f"{sep}... and {len(names) - shown} more" if len(names) > shown else ""
    return sep.join(names[:shown]) + more


def _set_param(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    setattr(owner, attr, tensor if attr.endswith(fp8.SCALE) else nn.Parameter(tensor, requires_grad=False))


def random_weights_(model: nn.Module, seed: int = 0, dtype: torch.dtype = torch.float32) -> None:
    """Seeded random weights of a healthy scale, every parameter touched (norms and scales near 1,
    biases and snake log-scales small, matrices ~ 1/sqrt(fan_in)). Works on ours and on transformers',
    and in place on any device (a meta-built model moved with `to_empty` is filled on the GPU). Experts held
    in fp8 (fp8.fp8_experts_) get the fp8 of the values the same model in `dtype` would hold."""
    gens: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() >= 2:
                fan_in = p.shape[-1] if ".experts." in f".{name}" else p[0].numel()
                value = torch.randn(p.shape, generator=g, device=p.device) / math.sqrt(max(1, fan_in))
            elif leaf in ("alpha", "beta"):
                value = torch.randn(p.shape, generator=g, device=p.device) * 0.1
            elif leaf == "bias":
                value = torch.randn(p.shape, generator=g, device=p.device) * 0.02
            else:
                value = 1.0 + 0.1 * torch.randn(p.shape, generator=g, device=p.device)
            if p.dtype == fp8.FP8:
                fp8.store_(model.get_submodule(name.rpartition(".")[0]), leaf, value.to(dtype))
            else:
                p.copy_(value.to(p.dtype))
