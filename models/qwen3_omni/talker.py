"""The talker: an MoE transformer that speaks the thinker's reply as codec frames. `codec_head` gives codebook 0
and the code predictor codebooks 1..15 (common/frame.py's FrameTalker). Thinker token embeddings and audio
positions' hidden states enter through two MLPs (used by talker_prompt.py)."""

from __future__ import annotations

import torch
from torch import nn

from models.common.code_predictor import CodePredictor
from models.common.config import ConfigError, TextConfig
from models.common.frame import FrameTalker
from models.common.layers import LayerStack, Linear, ResizeMLP, RMSNorm, Rope, text_layer
from models.qwen3_omni.config import TalkerConfig


class TalkerModel(LayerStack):
    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # Every talker layer is routed MoE with the shared expert (the reference builds a dense choice and then
        # replaces it, so `mlp_only_layers` / `decoder_sparse_step` have no effect).
        self.layers = nn.ModuleList(text_layer(cfg, moe=True) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, cfg.mrope_section)


class Talker(FrameTalker):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        text = cfg.text
        if text.num_experts == 0 or text.shared_expert_intermediate_size == 0:
            raise ConfigError("talker_config.text_config: the talker needs routed experts and a shared expert")
        self.cfg = cfg
        self.model = TalkerModel(text)
        self.codec_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self.text_projection = ResizeMLP(cfg.thinker_hidden_size, text.intermediate_size, text.hidden_size)
        self.hidden_projection = ResizeMLP(cfg.thinker_hidden_size, text.intermediate_size, text.hidden_size)
        self.code_predictor = CodePredictor(cfg.code_predictor)

    def project_text(self, thinker_embeds: torch.Tensor) -> torch.Tensor:
        return self.text_projection(thinker_embeds)

    def project_hidden(self, thinker_hidden: torch.Tensor) -> torch.Tensor:
        """Thinker hidden states (output of layer accept_hidden_layer - 1) -> talker inputs."""
        return self.hidden_projection(thinker_hidden)
