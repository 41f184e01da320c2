"""The frame LM's model side: a talker (`FrameTalker`, all the frame step and stage use of one) whose every step makes
one codec frame: codebook 0 from its codec head, codebooks 1..N-1 from the code predictor; the sum of the frame's code
embeddings is the codec part of the talker's next input."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .code_predictor import CodePredictor, Sampler, greedy
from .layers import KVCache, LayerStack

CONTROL_IDS = 1024  # the codec vocabulary's last ids are control ids, never sampled (except codec_eos)


def codec_suppress(vocab: int, eos: int) -> torch.Tensor:
    """[vocab] bool: the ids a talker never samples."""
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[vocab - CONTROL_IDS :] = True
    mask[eos] = False
    return mask


@dataclass(frozen=True)
class CodecFrame:
    codes: torch.Tensor  # [B, N] codebooks 0..N-1
    embed_sum: torch.Tensor  # [B, H] sum of the N codebook embeddings: the next talker input, less its text part


class FrameTalker(nn.Module):
    """A subclass builds `model` (a LayerStack with a `codec_embedding`), `codec_head` and `code_predictor`."""

    model: LayerStack
    codec_head: nn.Linear
    code_predictor: CodePredictor

    @property
    def hidden_size(self) -> int:
        return self.codec_head.in_features

    def forward(self, input_embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        return self.model(input_embeds, positions, cache)

    def codec_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, H] -> logits over codebook 0 and the codec's control ids [B, V]."""
        return self.codec_head(hidden)

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Codebook-0 (and control) ids [B] -> the talker's input embeddings [B, H]."""
        return self.model.codec_embedding(ids)

    def next_frame(self, hidden: torch.Tensor, code0: torch.Tensor, sample: Sampler = greedy) -> CodecFrame:
        """The full frame for codebook-0 code `code0` [B], chosen from the talker's hidden state [B, H]."""
        code0_embed = self.embed_codec(code0)
        rest = self.code_predictor.predict(hidden, code0_embed, sample)
        return CodecFrame(torch.cat((code0[:, None], rest.codes), dim=1), code0_embed + rest.embed_sum)
