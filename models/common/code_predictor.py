"""The code predictor: a small dense transformer filling in codebooks 1..15 of one frame, in 15 steps over 16 positions
with a cache that lives for that frame. It sees the talker's final hidden state and the talker's embedding of the
codebook-0 code first, then each code it chose (codebook g through `codec_embedding[g - 1]`); step g predicts codebook
g + 1 with head g."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from models.common import fused
from models.common.config import CodePredictorConfig
from models.common.layers import KVCache, LayerStack, Linear, RMSNorm, Rope, attention, text_layer

# sample(logits [B, V], step) -> ids [B]; step 0 chooses codebook 1.
Sampler = Callable[[torch.Tensor, int], torch.Tensor]


def greedy(logits: torch.Tensor, step: int) -> torch.Tensor:
    return logits.argmax(dim=-1)


@dataclass(frozen=True)
class PredictedCodes:
    codes: torch.Tensor  # [B, 15] codebooks 1..15
    embed_sum: torch.Tensor  # [B, H] sum of the predictor's embeddings of those 15 codes
    logits: torch.Tensor  # [B, 15, V] the logits each code was chosen from


class FrameKVCache:
    """One frame's keys and values, all its positions preallocated per layer: the new ones are written in place
    and attended with the rest (on CUDA one kernel, fused.frame_attention_triton, for the copy and attention)."""

    def __init__(self, cfg: CodePredictorConfig, batch: int, like: torch.Tensor) -> None:
        shape = (cfg.num_hidden_layers, batch, cfg.num_code_groups, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.empty(shape, dtype=like.dtype, device=like.device)
        self.v = torch.empty(shape, dtype=like.dtype, device=like.device)
        self.length = [0] * cfg.num_hidden_layers

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        past, t = self.length[layer], k.shape[1]
        self.length[layer] = past + t
        kb, vb = self.k[layer], self.v[layer]
        if fused.frame_attention_usable(q, k, kb):
            return fused.frame_attention_triton(q, k, v, kb, vb, past, scale)
        kb[:, past : past + t], vb[:, past : past + t] = k, v
        return attention(q, kb[:, : past + t], vb[:, : past + t], scale, past)


class CodePredictorModel(LayerStack):
    def __init__(self, cfg: CodePredictorConfig) -> None:
        super().__init__()
        groups = cfg.num_code_groups - 1
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.hidden_size) for _ in range(groups))
        self.layers = nn.ModuleList(text_layer(cfg, moe=False) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta)


class CodePredictor(nn.Module):
    def __init__(self, cfg: CodePredictorConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = CodePredictorModel(cfg)
        self.lm_head = nn.ModuleList(Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
                                     for _ in range(cfg.num_code_groups - 1))

    @property
    def num_steps(self) -> int:
        return self.cfg.num_code_groups - 1

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        return self.model(self.project(embeds), positions, cache)

    def project(self, embeds: torch.Tensor) -> torch.Tensor:
        """The inputs to the layers' width (a subclass's predictor may be narrower than its talker)."""
        return embeds

    def embed(self, ids: torch.Tensor, step: int) -> torch.Tensor:
        return self.model.codec_embedding[step](ids)

    def predict(self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor,
                sample: Sampler = greedy) -> PredictedCodes:
        """talker_hidden, code0_embed [B, H] -> codebooks 1..15 of the frame."""
        b, dev = talker_hidden.shape[0], talker_hidden.device
        cache = FrameKVCache(self.cfg, b, code0_embed)
        x = torch.stack((talker_hidden, code0_embed), dim=1)
        cos, sin = self.model.rope(torch.arange(self.num_steps + 1, device=dev).expand(b, -1), x.dtype)  # all at once
        codes, logits, embed_sum = [], [], torch.zeros_like(code0_embed)
        for step in range(self.num_steps):
            at = slice(0, 2) if step == 0 else slice(step + 1, step + 2)
            step_logits = self.lm_head[step](self.model.rotated(self.project(x), cos[:, at], sin[:, at], cache)[:, -1])
            ids = sample(step_logits, step)
            emb = self.embed(ids, step)
            codes.append(ids)
            logits.append(step_logits)
            embed_sum = embed_sum + emb
            x = emb[:, None]
        return PredictedCodes(torch.stack(codes, dim=1), embed_sum, torch.stack(logits, dim=1))
