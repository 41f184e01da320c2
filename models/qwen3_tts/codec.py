"""Qwen3-TTS's 12 Hz codec decoder (`speech_tokenizer/`): Code2Wav, causal (F frames make F * 1920
samples), with its own code embedding: a split residual VQ (codebook 0 alone, 1..15 together, each group
summing `embedding_sum / cluster_usage` rows, then a 1x1 conv; the groups add) and a causal conv of
kernel 3 to `latent_dim`, which reads the 2 frames before each (`context`).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from models.common.code2wav import CausalConv, Code2Wav
from models.common.weights import load_weights

from .codec_config import CodecDecoderConfig


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, n] -> [B, n, dim]."""
        return F.embedding(codes, self.embedding_sum / self.cluster_usage.clamp(min=self.eps)[:, None])


class CodebookGroup(nn.Module):
    """Residual codebooks whose vectors add, then a 1x1 conv (no bias) to the output width."""

    def __init__(self, count: int, size: int, dim: int, out: int) -> None:
        super().__init__()
        self.codebooks = nn.ModuleList(Codebook(size, dim) for _ in range(count))
        self.output_proj = nn.Conv1d(dim, out, 1, bias=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        total = self.codebooks[0](codes[:, 0])
        for q in range(1, len(self.codebooks)):
            total = total + self.codebooks[q](codes[:, q])
        return self.output_proj(total.transpose(1, 2))


class SplitRVQEmbedding(nn.Module):
    """codes [B, Q, F] -> [B, F, latent_dim]; a StreamingEmbedding (see code2wav_batch.py)."""

    def __init__(self, cfg: CodecDecoderConfig, semantic: int = 1) -> None:
        super().__init__()
        dim, size = cfg.codebook_dim // 2, cfg.codebook_size
        self.quantizers, self.semantic = cfg.num_quantizers, semantic
        self.first = CodebookGroup(semantic, size, dim, cfg.codebook_dim)
        self.rest = CodebookGroup(cfg.num_quantizers - semantic, size, dim, cfg.codebook_dim)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.context, self.channels = self.pre_conv.context, cfg.codebook_dim

    def inputs(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 3 or codes.shape[1] != self.quantizers:
            raise ValueError(f"expected codes [B, {self.quantizers}, F], got {tuple(codes.shape)}")
        return self.first(codes[:, : self.semantic]) + self.rest(codes[:, self.semantic :])

    def mix(self, x: torch.Tensor, left: torch.Tensor | None) -> torch.Tensor:
        return self.pre_conv(x, left).transpose(1, 2)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.mix(self.inputs(codes), None)


def build_decoder(cfg: CodecDecoderConfig) -> Code2Wav:
    return Code2Wav(cfg, code_embedding=SplitRVQEmbedding(cfg), latent_dim=cfg.latent_dim, causal=True)


_QUANTIZER = re.compile(r"^decoder\.quantizer\.rvq_(first|rest)\.(.+)$")
_CODEBOOK = re.compile(r"^vq\.layers\.(\d+)\._codebook\.(embedding_sum|cluster_usage)$")


def decoder_name(key: str) -> str | None:
    """None for the encoder's keys and the quantizer's input projections (used only to encode)."""
    if not key.startswith("decoder."):
        return None
    m = _QUANTIZER.match(key)
    if m is not None:
        group, rest = f"code_embedding.{m[1]}", m[2]
        if rest == "input_proj.weight":
            return None
        cb = _CODEBOOK.match(rest)
        return f"{group}.codebooks.{cb[1]}.{cb[2]}" if cb is not None else f"{group}.{rest}"
    if key.startswith("decoder.pre_conv."):
        return "code_embedding." + key[len("decoder.") :]
    return key[len("decoder.") :]


def load_decoder(cfg: CodecDecoderConfig, directory: str | Path, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> Code2Wav:
    with torch.device("meta"):
        model = build_decoder(cfg)
    load_weights(model, directory, device=device, dtype=dtype, rename=decoder_name)
    return model.eval()
