"""Qwen3-Omni's talker stage: the frame LM's stage (models/common/frame_stage.py) over the MoE talker,
with the codec ids it never samples and how a turn's talker prompt is built (talker_prompt.py)."""

from __future__ import annotations

import torch

from models.common.frame import codec_suppress
from models.common.frame_stage import FrameStage
from pipelines.kv_cache import PagedKVCache
from pipelines.stage import StageConfig

from .conversation import TurnState
from .model import Qwen3Omni
from .talker_prompt import assistant_prefix


class TalkerStep(FrameStage):
    def __init__(self, model: Qwen3Omni, dtype: torch.dtype, kv: PagedKVCache, sc: StageConfig) -> None:
        eos = model.cfg.talker.codec_eos_id
        super().__init__(model.talker, dtype, kv, sc, eos, codec_suppress(model.cfg.talker.text.vocab_size, eos))
        self.model = model

    def prompt(self, turn: TurnState) -> torch.Tensor:
        cfg = self.model.cfg
        speaker = cfg.talker.speaker_id(turn.options.speaker)
        prefix = assistant_prefix(self.model.talker, cfg, turn.head_embeds, turn.tts, speaker)
        users = turn.session.talker_users
        return torch.cat((users.all(), prefix)) if users.n else prefix  # a conversation may have no user turn
