"""The thinker: the MoE language model that reads text and audio tokens and writes the reply text.
Positions: for text and audio the reference's multimodal rope index is the plain token index on all three rows
with rope delta 0, so a token's position is the number of tokens before it in the session. `capture_layer`
indexes like transformers' `hidden_states`: 0 the input embeddings, k the output of layer k-1, and the last
(num_hidden_layers) the final-norm output; the talker reads `accept_hidden_layer`."""

from __future__ import annotations

import torch
from torch import nn

from models.common.config import TextConfig
from models.common.layers import KVCache, Linear, RMSNorm, Rope, final_norm, text_layer

from .audio_encoder import AudioEncoder
from .config import ThinkerConfig


class TextModel(nn.Module):
    """Embedding table, decoder layers and final norm (checkpoint names `embed_tokens`, `layers`, `norm`)."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(text_layer(cfg, cfg.is_moe_layer(i)) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, cfg.mrope_section)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None,
                capture_layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = len(self.layers)
        if capture_layer is not None and not 0 <= capture_layer <= n:
            raise ValueError(f"capture_layer {capture_layer} is outside 0..{n}")
        cos, sin = self.rope(positions, x.dtype)
        captured, delta = (x if capture_layer == 0 else None), None
        for i, layer in enumerate(self.layers):
            x, delta = layer.deferred(x, delta, cos, sin, i, cache)
            if capture_layer == i + 1 and i + 1 < n:
                x, delta = x + delta, None
                captured = x
        x = final_norm(self.norm, x, delta)
        if capture_layer == n:
            captured = x
        return x, captured


class ThinkerText(nn.Module):
    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.model = TextModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def forward(self, input_embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None,
                capture_layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_embeds [B, T, H], positions [3, B, T] or [B, T]. With `cache`, the T tokens follow what
        it holds. Returns (hidden after the final norm [B, T, H], hidden_states[capture_layer] or None)."""
        return self.model(input_embeds, positions, cache, capture_layer)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class Thinker(ThinkerText):
    """The whole thinker checkpoint subtree: `audio_tower`, `model`, `lm_head`."""

    def __init__(self, cfg: ThinkerConfig) -> None:
        super().__init__(cfg.text)
        self.cfg = cfg
        self.audio_tower = AudioEncoder(cfg.audio)

    def embed_prompt(self, ids: torch.Tensor, audio: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings of `ids` [B, T] with the encoder's output `audio` [N, H] at the audio_pad positions."""
        x = self.embed(ids)
        if audio is None:
            return x
        return merge_audio(x, ids, audio, self.cfg.audio_token_id)


def merge_audio(embeds: torch.Tensor, ids: torch.Tensor, audio: torch.Tensor, audio_token_id: int) -> torch.Tensor:
    """Replace the embeddings at `ids == audio_token_id` ([B, T]) by the rows of `audio` [N, H], in row-major
    order; N must equal the number of audio_pad tokens."""
    mask = ids == audio_token_id
    count = int(mask.sum())
    if count != audio.shape[0]:
        raise ValueError(f"{count} audio_pad tokens but {audio.shape[0]} audio embeddings")
    return embeds.masked_scatter(mask[..., None], audio.to(embeds.dtype))

