"""Qwen3-TTS's talker: a dense Qwen3 making one 16-codebook frame per step (a frame.FrameTalker), fed by a text
embedding (2048 wide) and its projection plus the codec embedding. Its code predictor's codebook embeddings are in
the talker's width; `small_to_mtp_projection` (none when the widths match) maps every predictor input to its own."""

from __future__ import annotations

import torch
from torch import nn

from models.common.code_predictor import CodePredictor
from models.common.config import CodePredictorConfig
from models.common.frame import FrameTalker
from models.common.layers import LayerStack, Linear, ResizeMLP, RMSNorm, Rope, text_layer

from .config import TalkerConfig


class TtsCodePredictor(CodePredictor):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__(cfg)
        groups = cfg.num_code_groups - 1
        self.model.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(groups))
        self.small_to_mtp_projection = (nn.Linear(talker_hidden, cfg.hidden_size) if talker_hidden != cfg.hidden_size
                                        else nn.Identity())

    def project(self, embeds: torch.Tensor) -> torch.Tensor:
        return self.small_to_mtp_projection(embeds)


class TalkerModel(LayerStack):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        t = cfg.text
        self.codec_embedding = nn.Embedding(t.vocab_size, t.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.layers = nn.ModuleList(text_layer(t, moe=False) for _ in range(t.num_hidden_layers))
        self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps)
        self.rope = Rope(t.head_dim, t.rope_theta)


class Talker(FrameTalker):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.text.hidden_size
        self.model = TalkerModel(cfg)
        self.text_projection = ResizeMLP(cfg.text_hidden_size, cfg.text_hidden_size, h)
        self.codec_head = Linear(h, cfg.text.vocab_size, bias=False)
        self.code_predictor = TtsCodePredictor(cfg.code_predictor, h)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids [...] -> their projected rows in the talker's width [..., H]."""
        return self.text_projection(self.model.text_embedding(ids))
