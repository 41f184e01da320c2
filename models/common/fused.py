"""Fused Triton kernels (one each instead of 5 to 24) for RMSNorm, residual add + RMSNorm, per-head QK RMSNorm +
rotate-half rope, the codec's SnakeBeta, the MoE router (softmax, top-k, renormalise) and SwiGLU's silu(gate) * up, and
the code predictor's attention over its frame's few positions, on CUDA tensors at inference; anything else takes the
torch path.

They round where the torch path rounds (the norm in float32, cast to the dtype, then the weight multiply rounded; rope's
products and sum each rounded) and with no FMA contraction (`enable_fp_fusion=False`), as eager's separate multiply and
add kernels round twice. The router's softmax takes CUDA's expf and rounded division as torch's does; only its sums run
in another order. Launches depend on shapes only, so CUDA graphs can capture them once warmed up eagerly (the first call
compiles)."""

from __future__ import annotations

import importlib.util
from collections.abc import Collection

import torch
import torch.nn.functional as F

HAVE_TRITON = importlib.util.find_spec("triton") is not None  # CPU-only torch builds ship without it
KERNELS = ("norm", "rope", "snake", "silu_mul", "route", "align", "frame_attention")  # this module's
SWITCHES = (*KERNELS, "skinny", "sampling", "dispatch")  # with skinny.py's, the sampler's and the fp8 experts'
OFF: set[str] = set()  # the runtime may switch kernels off
ROUTE_MAX_EXPERTS = 256  # one row of logits in one warp's registers
ALIGN_MAX = 1024  # expert ids (tokens x top_k) sorted in one program: decode batches; larger ones take argsort
ALIGN_CHUNK = 64
SNAKE_BLOCK = SILU_BLOCK = 1024


def use_triton(on: bool, only: Collection[str] | None = None) -> None:
    """Our Triton kernels in the steps on or off (`--no-triton`; off: torch's kernels, to compare or to route
    around a misbehaving kernel); `only`: just these of SWITCHES (a benchmark's bisection). The fp8 experts keep
    their grouped kernel (no capturable torch op does it); "dispatch" off, their gather and scatter are torch ops."""
    from pipelines import sampling

    from . import fp8_moe, skinny

    names = set(SWITCHES if only is None else only)
    if unknown := names - set(SWITCHES):
        raise ValueError(f"unknown kernels {sorted(unknown)}; known: {', '.join(SWITCHES)}")
    if on:
        OFF.difference_update(names)
    else:
        OFF.update(names)
    skinny.ENABLED, sampling.FUSED, fp8_moe.DISPATCH = ("skinny" not in OFF, "sampling" not in OFF,
                                                        "dispatch" not in OFF)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def snake_torch(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    alpha, beta = alpha.exp()[:, None], beta.exp()[:, None]
    return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def route_torch(logits: torch.Tensor, top_k: int, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    weights, idx = probs.topk(top_k, dim=-1)
    if norm_topk:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, idx


def _use_triton(kernel: str, *ts: torch.Tensor | None) -> bool:
    ts = [t for t in ts if t is not None]
    return (kernel not in OFF and HAVE_TRITON and all(t.is_cuda and t.dtype == ts[0].dtype for t in ts)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in ts)))


def _vec(w: torch.Tensor | None, n: int) -> bool:
    return w is None or (w.shape == (n,) and w.is_contiguous())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    fuse = _use_triton("norm", x, weight) and _vec(weight, x.shape[-1])
    return rms_norm_triton(x, weight, eps) if fuse else rms_norm_torch(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, rms_norm(s)) with s = x + residual rounded to x's dtype, as eager computes them."""
    if _use_triton("norm", x, residual, weight) and x.shape == residual.shape and _vec(weight, x.shape[-1]):
        return add_rms_norm_triton(x, residual, weight, eps)
    s = x + residual
    return s, rms_norm_torch(s, weight, eps)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                 eps: float, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, T, Hq, D], k: [B, T, Hkv, D] (views of a fused qkv are fine); cos, sin: [B, T, D]. Per-head
    RMSNorm (none when the weights are None), then rotate-half rope."""
    if _use_triton("rope", q, k, q_weight, k_weight, cos, sin) and _vec(q_weight, q.shape[-1]) \
            and _vec(k_weight, k.shape[-1]):
        return qk_norm_rope_triton(q, k, q_weight, k_weight, eps, cos, sin)
    if q_weight is not None:
        q, k = rms_norm_torch(q, q_weight, eps), rms_norm_torch(k, k_weight, eps)
    return rope_torch(q, cos, sin), rope_torch(k, cos, sin)


def snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """SnakeBeta over x [B, C, T] with per-channel log-scale alpha and beta [C]."""
    if _use_triton("snake", x, alpha, beta) and x.dim() == 3 and _vec(alpha, x.shape[1]) and _vec(beta, x.shape[1]):
        return snake_triton(x, alpha, beta)
    return snake_torch(x, alpha, beta)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [..., 2I] = [gate | up] -> [..., I], each rounded as eager rounds."""
    if _use_triton("silu_mul", gate_up) and gate_up.shape[-1] % 2 == 0:
        return silu_mul_triton(gate_up)
    return silu_mul_torch(gate_up)


def route(logits: torch.Tensor, top_k: int, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [N, E] -> (weights [N, K] float32, expert ids [N, K] int64), larger weights first: softmax
    over the E experts in float32, the top K, with norm_topk divided by their sum. Among equal probabilities the
    fused kernel takes the lowest expert id first (torch's topk does not promise an order)."""
    if _use_triton("route", logits) and logits.dim() == 2 and logits.shape[1] <= ROUTE_MAX_EXPERTS:
        return route_triton(logits, top_k, norm_topk)
    return route_torch(logits, top_k, norm_topk)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _warps(block: int) -> int:
    return min(max(block // 256, 1), 8)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])  # a view where the leading dims merge, else a copy
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return add_rms_norm_triton(x, None, weight, eps)[1]


def add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, its norm) in one kernel; without a residual, (x, norm of x)."""
    from . import fused_kernels as K

    x2 = _rows(x)
    r2 = x2 if residual is None else _rows(residual)
    s = x if residual is None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n, block = x.shape[-1], _pow2(x.shape[-1])
    if x2.shape[0]:
        K._norm_rows[(x2.shape[0],)](
            x2, r2, weight, out, s, n, x2.stride(0), r2.stride(0), n, n, eps, 1.0 / n, HAS_RES=residual is not None,
            BLOCK=block, num_warps=_warps(block), enable_fp_fusion=False)
    return s, out


def qk_norm_rope_triton(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                        eps: float, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    if d % 2 or k.shape != (b, t, hkv, d):
        raise ValueError(f"qk_norm_rope: q {tuple(q.shape)} and k {tuple(k.shape)} need the same B, T and an even D")
    from . import fused_kernels as K
    q, k = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k))
    cos, sin = (c.expand(b, t, d) for c in (cos, sin))
    cos, sin = (c if c.stride(-1) == 1 else c.contiguous() for c in (cos, sin))
    qo, ko = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k))
    norm = q_weight is not None
    block = _pow2(d // 2)
    if b * t:
        K._qk_norm_rope[(b * t, hq + hkv)](
            q, k, q_weight if norm else q, k_weight if norm else k, cos, sin, qo, ko, t, hq, *q.stride()[:3],
            *k.stride()[:3], *cos.stride()[:2], *sin.stride()[:2], eps, 1.0 / d, NORM=norm, HALF=d // 2, BLOCK=block,
            num_warps=_warps(block), enable_fp_fusion=False)
    return qo, ko


def snake_triton(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    from . import fused_kernels as K

    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        K._snake[(-(-x.numel() // SNAKE_BLOCK),)](x, alpha, beta, out, x.numel(), x.shape[2], x.shape[1],
                                                   BLOCK=SNAKE_BLOCK, num_warps=4, enable_fp_fusion=False)
    return out


def route_triton(logits: torch.Tensor, top_k: int, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]:
    n, e = logits.shape
    if not 0 < top_k <= e:
        raise ValueError(f"route: top_k {top_k} of {e} experts")
    from . import fused_kernels as K

    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    weights = torch.empty(n, top_k, dtype=torch.float32, device=logits.device)
    idx = torch.empty(n, top_k, dtype=torch.int64, device=logits.device)
    if n:
        K._route[(n,)](logits, weights, idx, e, logits.stride(0), TOP_K=top_k, NORM=norm_topk, BLOCK=_pow2(e),
                       K_BLOCK=_pow2(top_k), num_warps=1, enable_fp_fusion=False, enable_reflect_ftz=False)
    return weights, idx


def align(ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token copies' expert ids [N] -> (their stable order by expert [N] int64, each expert's end in that order
    [E] int32): a MoE's dispatch."""
    if _use_triton("align", ids) and ids.dim() == 1 and ids.is_contiguous() and 0 < ids.numel() <= ALIGN_MAX \
            and (n_experts + 1) * max(_pow2(ids.numel()), ALIGN_CHUNK) < 2**31:
        return align_triton(ids, n_experts)
    return align_torch(ids, n_experts)


def align_torch(ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = (ids.to(torch.int16) if n_experts <= 1 << 15 else ids).argsort(stable=True)  # 16-bit keys: fewer passes
    experts = torch.arange(n_experts, device=ids.device, dtype=ids.dtype)
    return order, torch.searchsorted(ids[order], experts, right=True, out_int32=True)


def align_triton(ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    from . import fused_kernels as K

    order = torch.empty(ids.numel(), dtype=torch.int64, device=ids.device)
    ends = torch.empty(n_experts, dtype=torch.int32, device=ids.device)
    K._align[(1,)](ids, order, ends, ids.numel(), n_experts, BLOCK=max(_pow2(ids.numel()), ALIGN_CHUNK),
                   E_BLOCK=_pow2(n_experts), CHUNK=ALIGN_CHUNK, num_warps=4)
    return order, ends


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    from . import fused_kernels as K

    x2 = _rows(gate_up)
    half = x2.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], half, dtype=gate_up.dtype, device=gate_up.device)
    if x2.shape[0] and half:
        K._silu_mul[(x2.shape[0], -(-half // SILU_BLOCK))](x2, out, half, x2.stride(0), BLOCK=SILU_BLOCK, num_warps=4,
                                                           enable_fp_fusion=False, enable_reflect_ftz=False)
    return out


def frame_attention_usable(q: torch.Tensor, k: torch.Tensor, buf: torch.Tensor) -> bool:
    d = q.shape[-1]
    return (_use_triton("frame_attention", q, k, buf) and d == _pow2(d) and q.shape[2] % k.shape[2] == 0
            and all(x.stride(-1) == 1 and x.stride(2) == d for x in (q, k)) and buf.is_contiguous())


def frame_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor,
                           past: int, scale: float) -> torch.Tensor:
    """k, v [B, T, Hkv, D] stored at positions past.. of kbuf, vbuf [B, P, Hkv, D]; q [B, T, Hq, D] attends
    causally over positions 0 .. past + T - 1 -> [B, T, Hq, D]."""
    from . import fused_kernels as K

    b, t, hq, d = q.shape
    hkv, p = k.shape[2], kbuf.shape[1]
    if past + t > p or v.stride(-1) != 1 or v.stride(2) != d:
        raise ValueError(f"frame_attention: {past} + {t} positions in a buffer of {p}, or v's heads not packed")
    out = torch.empty(b, t, hq, d, dtype=q.dtype, device=q.device)
    if b:
        K._frame_attention[(b, hkv)](q, k, v, kbuf, vbuf, out, past, t, q.stride(0), q.stride(1), k.stride(0),
                                     k.stride(1), v.stride(0), v.stride(1), kbuf.stride(0), kbuf.stride(1),
                                     out.stride(0), out.stride(1), scale,
                                     GROUP=hq // hkv, D=d, P=_pow2(p), TQ=_pow2(t), num_warps=4)
    return out
