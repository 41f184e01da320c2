"""Code2Wav: 16 codebooks per 80 ms frame -> 1920 samples of 24 kHz audio. codes -> mean of 16 code embeddings ->
sliding-window causal transformer -> 2 x (transposed conv x2 + ConvNeXt) -> causal conv -> 4 decoder blocks (SnakeBeta,
transposed conv x r, 3 dilated residual units) -> SnakeBeta -> causal conv.

Every conv is causal (zero left padding of `context` inputs). A decoder transposed conv (kernel 2r, stride r, trimmed by
r at both ends) makes block j from inputs j and j+1; the block that would need the input after the last is dropped, not
guessed. That is the only look-ahead (`lookahead` = 1 input): F frames decode to F * 1920 - `holdback` (555) samples.
code2wav_batch.py streams the same modules."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from models.common import fused
from models.common.config import Code2WavConfig
from models.common.layers import DenseKVCache, KVCache, LayerStack, RMSNorm, Rope, SelfAttention, SwiGLU
from pipelines.fastest import fastest


def conv_matmul(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """conv(x) (groups 1, stride 1, no padding) as one batched matmul of the weight by x's columns."""
    b, c, length = x.shape
    co, _, k = conv.weight.shape
    d = conv.dilation[0]
    t = length - (k - 1) * d
    cols = x.as_strided((b, c, k, t), (x.stride(0), x.stride(1), d * x.stride(2), x.stride(2))).reshape(b, c * k, t)
    bias = conv.bias if conv.bias is not None else x.new_zeros(co)
    return torch.baddbmm(bias[None, :, None].expand(b, co, t), conv.weight.reshape(co, c * k).expand(b, co, c * k),
                         cols)


def _matmul_faster(conv: nn.Conv1d, x: torch.Tensor) -> bool:
    """For some dilated convs cuDNN picks a kernel 6-12x slower than conv_matmul (0.9 ms against 0.07-0.14 ms at
    48 rows on the H200, benchmarks/check_code2wav_batch.py --layers), for others it is up to 2x faster: a graph
    runner's warm-up times both per shape and keeps the faster (pipelines/fastest.py); untimed shapes take cuDNN."""
    key = ("conv", tuple(conv.weight.shape), conv.dilation[0], tuple(x.shape), x.dtype, x.device)
    return fastest(key, lambda: (lambda: conv(x), lambda: conv_matmul(x, conv))) == 1


class _Causal(nn.Module):
    """A layer whose `joined(seq)` is its output for seq's last T inputs, seq's first `context` their left context."""

    context: int

    def forward(self, x: torch.Tensor, left: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, C, T]; `left`: the `context` inputs before x (zeros when None)."""
        return self.joined(F.pad(x, (self.context, 0)) if left is None else torch.cat((left, x), dim=-1))


class CausalConv(_Causal):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation

    def joined(self, seq: torch.Tensor) -> torch.Tensor:
        conv = self.conv
        if conv.dilation[0] > 1 and conv.groups == 1 and seq.is_cuda and _matmul_faster(conv, seq):
            return conv_matmul(seq, conv)
        return conv(seq)


class CausalTransConv(nn.Module):
    """Transposed conv trimmed by kernel - stride at both ends (look-ahead: the last input's block is
    dropped), or, `causal`, at the right end only (no look-ahead: a block needs `context` inputs before)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, causal: bool = False) -> None:
        super().__init__()
        if kernel % stride:
            raise ValueError(f"kernel {kernel} is not a multiple of stride {stride}")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride
        self.lookahead = 0 if causal else self.trim // stride
        self.context = self.trim // stride if causal else 0

    def forward(self, x: torch.Tensor, left: torch.Tensor | None = None) -> torch.Tensor:
        """[B, C, T] -> [B, C', (T - lookahead) * stride]; `left` (causal only): the `context` inputs before x."""
        if self.context:
            if left is None:
                return self.joined(x, 0)
            return self.joined(torch.cat((left, x), dim=-1), left.shape[-1])
        y = self.conv(x)
        return y[..., self.trim : y.shape[-1] - self.trim]

    def joined(self, seq: torch.Tensor, left: int | None = None) -> torch.Tensor:
        """Causal: `forward` of seq's inputs after its first `left` (default `context`), their left context.
        Zeros there change nothing after them, so a fresh stream's zeros equal no context."""
        n = (self.context if left is None else left) * self.conv.stride[0]
        y = self.conv(seq)
        return y[..., n : y.shape[-1] - self.trim]


class SnakeBeta(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.snake(x, self.alpha, self.beta)


class ConvNeXt(_Causal):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))
        self.context = self.dwconv.context

    def joined(self, seq: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.dwconv.joined(seq).transpose(1, 2))
        h = self.pwconv2(F.gelu(self.pwconv1(h)))
        return seq[..., self.context :] + (self.gamma * h).transpose(1, 2)


class ResidualUnit(_Causal):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)
        self.context = self.conv1.context

    def joined(self, seq: torch.Tensor) -> torch.Tensor:
        # SnakeBeta is pointwise and 0 at 0, so act1 of the padded input is the padded act1 of the input.
        h = self.conv1.joined(self.act1(seq))
        return seq[..., self.context :] + self.conv2(self.act2(h))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int, causal: bool = False) -> None:
        super().__init__()
        units = [ResidualUnit(cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate, causal), *units])


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = SelfAttention(h, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, eps,
                                       qk_norm=False)
        self.self_attn_layer_scale = LayerScale(h)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = SwiGLU(h, cfg.intermediate_size)
        self.mlp_layer_scale = LayerScale(h)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                cache: KVCache) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, layer, cache))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(LayerStack):
    def __init__(self, cfg: Code2WavConfig, latent_dim: int | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta)
        self.input_proj = nn.Linear(latent_dim, cfg.hidden_size) if latent_dim else None
        self.output_proj = nn.Linear(cfg.hidden_size, latent_dim) if latent_dim else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x: [B, T, H] (or latent_dim); positions: [B, T] frame indices."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        x = super().forward(x, positions, cache)
        return x if self.output_proj is None else self.output_proj(x)


class CodeEmbedding(nn.Embedding):
    """codes [B, Q, F] -> [B, F, H]: the mean of the Q codebooks' embeddings, from one table where
    codebook q's codes sit after the q codebooks before it (checkpoint name `code_embedding.weight`)."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__(cfg.codebook_size * cfg.num_quantizers, cfg.hidden_size)
        self.quantizers, self.codebook_size = cfg.num_quantizers, cfg.codebook_size

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        q = self.quantizers
        if codes.shape[1] != q:
            raise ValueError(f"expected {q} codebooks, got codes of shape {tuple(codes.shape)}")
        offset = torch.arange(q, device=codes.device)[None, :, None] * self.codebook_size
        return super().forward(codes + offset).mean(1)


class Code2Wav(nn.Module):
    """`code_embedding`: another codec's (codes [B, Q, F] -> [B, F, latent_dim or hidden_size]; see
    code2wav_batch.StreamingEmbedding); `latent_dim`: its width and that of the conv layers; `causal`: the
    decoder's transposed convs look back one input instead of ahead (holdback 0)."""

    def __init__(self, cfg: Code2WavConfig, code_embedding: nn.Module | None = None, latent_dim: int | None = None,
                 causal: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = latent_dim or cfg.hidden_size, cfg.decoder_dim
        self.code_embedding = code_embedding if code_embedding is not None else CodeEmbedding(cfg)
        self.pre_transformer = Transformer(cfg, latent_dim)
        self.upsample = nn.ModuleList(nn.ModuleList([CausalTransConv(h, h, r, r), ConvNeXt(h)])
                                      for r in cfg.upsampling_ratios)
        blocks = [DecoderBlock(d >> i, d >> (i + 1), r, causal) for i, r in enumerate(cfg.upsample_rates)]
        out = d >> len(cfg.upsample_rates)
        self.decoder = nn.ModuleList([CausalConv(h, d, 7), *blocks, SnakeBeta(out), CausalConv(out, 1, 7)])

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        return self.code_embedding(codes)

    def conv_layers(self) -> Iterator[nn.Module]:
        for pair in self.upsample:
            yield from pair
        for layer in self.decoder:
            yield from layer.block if isinstance(layer, DecoderBlock) else (layer,)

    def decode(self, codes: torch.Tensor, clamp: bool = True) -> torch.Tensor:
        """codes [B, Q, F] -> waveform [B, 1, F * samples_per_frame - holdback], in [-1, 1] if `clamp`."""
        b, _, f = codes.shape
        positions = torch.arange(f, device=codes.device).expand(b, f)
        cache = DenseKVCache(self.cfg.num_hidden_layers, self.cfg.sliding_window)
        h = self.pre_transformer(self.embed(codes), positions, cache).transpose(1, 2)
        for layer in self.conv_layers():
            h = layer(h)
        return h.clamp(-1, 1) if clamp else h

    @property
    def holdback(self) -> int:
        """Samples of the last frames' audio that depend on the next frame."""
        held = 0
        for layer in self.conv_layers():
            if isinstance(layer, CausalTransConv):
                held = (held + layer.lookahead) * layer.conv.stride[0]
        return held

    forward = decode
