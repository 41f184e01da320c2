"""Building blocks of the thinker, the talkers, the code predictor and Code2Wav. Parameter names are the checkpoint's
but the fused ones (weights.py maps them): `qkv` rows [q | k | v], `gate_up` rows [gate | up], stacked experts `w13` [E,
2I, H] and `w2` [E, H, I]."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.kv_cache import sdpa

from . import fp8_moe, fused, skinny
from .config import CodePredictorConfig, TextConfig

USE_GROUPED_ON_CPU = False  # the per-expert loop is the CPU path; tests flip this to check both agree


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm(x, self.weight, self.eps)


class Linear(nn.Linear):
    """nn.Linear, through skinny.py for a few rows on CUDA (decode) where that is the faster."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return skinny.linear(x, self.weight, self.bias)


class Rope(nn.Module):
    """Rotary embedding over positions [B, T]; with `mrope_section`, also interleaved multimodal rope over
    [3, B, T] (t, h, w) positions, which for equal rows (text, audio) is the plain rope."""

    def __init__(self, head_dim: int, theta: float, mrope_section: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.head_dim, self.theta, self.mrope_section = head_dim, theta, mrope_section
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            exps = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
            self._inv_freq[device] = 1.0 / (self.theta**exps)
        return self._inv_freq[device]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """-> cos, sin [B, T, head_dim]."""
        inv = self.inv_freq(positions.device)
        if positions.dim() == 2:
            freqs = positions[..., None].float() * inv
        else:
            per_axis = positions[..., None].float() * inv  # [3, B, T, D/2]
            freqs = per_axis[0].clone()
            for axis in (1, 2):
                idx = slice(axis, self.mrope_section[axis] * 3, 3)
                freqs[..., idx] = per_axis[axis, ..., idx]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, past: int = 0,
              window: int | None = None) -> torch.Tensor:
    """q [B, T, Hq, D], k, v [B, past + T, Hkv, D] -> [B, T, Hq, D]: query i sees keys j <= past + i (and
    j > past + i - window)."""
    t, n = q.shape[1], k.shape[1]
    mask = None  # one query after all its keys, no window: it sees every key
    if t > 1 or (window is not None and n > window):
        qi = torch.arange(t, device=q.device)[:, None] + past
        kj = torch.arange(n, device=q.device)[None, :]
        mask = kj <= qi
        if window is not None:
            mask &= kj > qi - window
    return sdpa(q, k, v, mask, scale)


class KVCache(Protocol):
    """What an attention layer needs from a cache. The runtime supplies a paged implementation. One may also have
    `pad` [B * T] bool: the padding tokens of a fixed-shape step, whose outputs nothing reads (MoE skips them)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Store k, v [B, T, Hkv, D] for `layer` after what is cached, attend q over all of it causally."""


class DenseKVCache:
    """Contiguous per-layer cache for a batch whose rows share one length (tests, one stream). With a sliding
    `window`, per layer only the last window - 1 keys, all a later query can see."""

    def __init__(self, num_layers: int, window: int | None = None) -> None:
        self.window = window
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    def length(self, layer: int = 0) -> int:
        k = self.k[layer]
        return 0 if k is None else k.shape[1]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        past = self.length(layer)
        if past:
            k = torch.cat((self.k[layer], k), dim=1)
            v = torch.cat((self.v[layer], v), dim=1)
        keep = 0 if self.window is None else max(k.shape[1] - (self.window - 1), 0)
        self.k[layer], self.v[layer] = k[:, keep:], v[:, keep:]
        return attention(q, k, v, scale, past, self.window)


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, qk_norm: bool,
                 bias: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.qkv = Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=bias)
        self.o_proj = Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.scale = head_dim**-0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                cache: KVCache | None) -> torch.Tensor:
        b, t, _ = x.shape
        d = self.head_dim
        q, k, v = self.qkv(x).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q, k, v = q.view(b, t, -1, d), k.view(b, t, -1, d), v.view(b, t, -1, d)
        qw, kw = (None, None) if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight)
        eps = 0.0 if self.q_norm is None else self.q_norm.eps
        q, k = fused.qk_norm_rope(q, k, qw, kw, eps, cos, sin)  # per-head norms, then rotate-half rope
        out = attention(q, k, v, self.scale) if cache is None else cache.attend(layer, q, k, v, self.scale)
        return self.o_proj(out.reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up = Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        return self.down_proj(fused.silu_mul(self.gate_up(x)))  # dense: padding costs what it costs


class Experts(nn.Module):
    """Stacked SwiGLU experts. Token copies are sorted by expert; one grouped matmul per projection runs
    every expert at once (no host sync), or, where grouped matmul cannot run, one matmul per expert."""

    def __init__(self, num: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(num, 2 * intermediate, hidden))
        self.w2 = nn.Parameter(torch.empty(num, hidden, intermediate))

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x: [N, H]; idx, weights: [N, K]. Returns the weighted sum of each token's K experts."""
        k = idx.shape[1]
        order, ends = fused.align(idx.reshape(-1), self.w13.shape[0])
        dispatch = fp8_moe.Dispatch(order, k, weights.reshape(-1))
        if self.w13.dtype == torch.float8_e4m3fn:  # fp8.fp8_experts_; the gather and scatter in its kernels
            by_copy = fp8_moe.experts_swiglu(x, ends, dispatch, self.w13, self.w13_scale_inv, self.w2,
                                             self.w2_scale_inv)
            return by_copy.view(x.shape[0], k, -1).sum(1)
        xs = dispatch.rows(x)
        if self.grouped(x):
            h = fused.silu_mul(torch._grouped_mm(xs, self.w13.transpose(1, 2), offs=ends))
            ys = torch._grouped_mm(h, self.w2.transpose(1, 2), offs=ends)
        else:
            ys = torch.empty_like(xs)
            start = 0
            for e, end in enumerate(ends.tolist()):
                if end > start:
                    gate, up = F.linear(xs[start:end], self.w13[e]).chunk(2, dim=-1)
                    ys[start:end] = F.linear(F.silu(gate) * up, self.w2[e])
                start = end
        return dispatch.place(ys).view(x.shape[0], k, -1).sum(1)

    def grouped(self, x: torch.Tensor) -> bool:
        """Grouped matmul needs 16-byte aligned rows; on CUDA it runs in bf16 (Hopper)."""
        align = 16 // x.element_size()
        if not hasattr(torch, "_grouped_mm") or self.w13.shape[1] % (2 * align) or self.w13.shape[2] % align:
            return False
        return x.dtype == torch.bfloat16 if x.is_cuda else USE_GROUPED_ON_CPU

class MoE(nn.Module):
    """Top-k routed experts (softmax over all experts, optional renormalised top-k), optional shared
    expert scaled by a sigmoid gate (the talker's)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, intermediate: int, norm_topk: bool,
                 shared: int = 0) -> None:
        super().__init__()
        self.top_k, self.norm_topk = top_k, norm_topk
        self.gate = Linear(hidden, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden, intermediate)
        self.shared_expert = SwiGLU(hidden, shared) if shared else None
        self.shared_expert_gate = Linear(hidden, 1, bias=False) if shared else None

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        """`pad` [N] (KVCache.pad): those tokens go to no expert (an id past the last sorts after every copy and
        is in no expert's rows), and their routed output is 0."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, idx = fused.route(self.gate(x), self.top_k, self.norm_topk)
        if pad is not None:
            idx = idx.masked_fill(pad[:, None], self.experts.w13.shape[0])
        out = self.experts(x, idx, weights.to(x.dtype))
        if pad is not None:
            out = out.masked_fill(pad[:, None], 0)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape)


class DecoderLayer(nn.Module):
    """Pre-norm block: GQA self-attention with per-head QK RMSNorm, then `mlp` (SwiGLU or MoE)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, mlp: nn.Module,
                 bias: bool = False) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = SelfAttention(hidden, heads, kv_heads, head_dim, eps, qk_norm=True, bias=bias)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                cache: KVCache | None) -> torch.Tensor:
        x, out = self.deferred(x, None, cos, sin, layer, cache)
        return x + out

    def deferred(self, x: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 layer: int, cache: KVCache | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The block over x + delta (the previous block's MLP output, added here in the input norm's kernel);
        -> (its residual stream before the MLP, the MLP's output), to be added by the next norm."""
        pre, post = self.input_layernorm, self.post_attention_layernorm
        x, h = (x, pre(x)) if delta is None else fused.add_rms_norm(delta, x, pre.weight, pre.eps)
        x, h = fused.add_rms_norm(self.self_attn(h, cos, sin, layer, cache), x, post.weight, post.eps)
        return x, self.mlp(h, getattr(cache, "pad", None))


def text_layer(cfg: TextConfig | CodePredictorConfig, moe: bool) -> DecoderLayer:
    h = cfg.hidden_size
    mlp = SwiGLU(h, cfg.intermediate_size) if not moe else MoE(
        h, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob,
        shared=cfg.shared_expert_intermediate_size)
    return DecoderLayer(h, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps, mlp,
                        cfg.attention_bias)


class LayerStack(nn.Module):
    """A subclass builds `layers`, `norm` and `rope`; x [B, T, H], positions [B, T] (or [3, B, T]) -> the final
    normed hidden states [B, T, H]."""

    layers: nn.ModuleList
    norm: RMSNorm
    rope: Rope

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        return self.rotated(x, *self.rope(positions, x.dtype), cache)

    def rotated(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        delta = None
        for i, layer in enumerate(self.layers):
            if isinstance(layer, DecoderLayer):
                x, delta = layer.deferred(x, delta, cos, sin, i, cache)
            else:
                x = layer(x, cos, sin, i, cache)
        return final_norm(self.norm, x, delta)


def final_norm(norm: RMSNorm, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
    """norm(x + delta), the add in the norm's kernel."""
    return norm(x) if delta is None else fused.add_rms_norm(delta, x, norm.weight, norm.eps)[1]


class ResizeMLP(nn.Module):
    def __init__(self, inp: int, intermediate: int, out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(inp, intermediate)
        self.linear_fc2 = nn.Linear(intermediate, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))
