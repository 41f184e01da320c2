"""Qwen3-TTS's talker stage: the common frame LM stage with this model's suppressed ids and minimum frames.
Its work feeds the prompt, then per frame the frame's code embedding sum plus that step's text row."""

from __future__ import annotations

import torch

from models.common.frame import codec_suppress
from models.common.frame_stage import FrameStage
from models.common.speaking import FrameWork
from pipelines.kv_cache import PagedKVCache
from pipelines.stage import StageConfig

from .config import TtsConfig
from .state import TurnState
from .talker import Talker

MIN_FRAMES = 2  # the reference's min_new_tokens: no EOS before the third token


class TalkerWork(FrameWork):
    def __init__(self, turn: TurnState, kv: PagedKVCache) -> None:
        super().__init__(turn, kv)
        self.turn: TurnState = turn
        self.inputs.append(turn.prompt.embeds)

    def pending(self) -> int:
        t = self.turn
        if t.finished or t.talker_done:
            return 0
        if self.next_embed is not None:
            self.feed(t.prompt.text_for_step(self.steps))
        return self.unfed()


class TalkerStep(FrameStage):
    def __init__(self, talker: Talker, cfg: TtsConfig, dtype: torch.dtype, kv: PagedKVCache, sc: StageConfig) -> None:
        eos = cfg.talker.codec_eos_id
        super().__init__(talker, dtype, kv, sc, eos, codec_suppress(cfg.talker.text.vocab_size, eos),
                         min_frames=MIN_FRAMES)
