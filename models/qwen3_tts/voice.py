"""Qwen3-TTS as the voice of another model's replies (pipelines/voice.py): its talker reads the reply in the
streamed-text mode (prompt.py), starting on the reply's first token; decode step k reads reply token k + 1, the
voice's tts_eos once the reply has ended, then tts_pad; when the talker is ahead of the writer it waits.
The writer's token ids are read as they are: the two tokenizers must agree (`reads`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from models.common.code2wav_step import Code2WavWork
from models.common.speaking import FrameWork
from models.common.tokenizer import Tokenizer
from pipelines.kv_cache import PagedKVCache
from pipelines.stage import Stage
from pipelines.types import GenerationOptions
from pipelines.voice import Reply

from .model import Qwen3Tts
from .program import TtsPipelineConfig, load
from .prompt import TextIds, build_prompt
from .spec import Generation, TurnSettings, tts_spec

ROLE_TEXT, TAIL_TEXT = "<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>assistant\n"


class TtsVoice:
    def __init__(self, model: Qwen3Tts, tokenizer: Tokenizer, gen: Generation, cfg: TtsPipelineConfig) -> None:
        self.model, self.tokenizer, self.gen = model, tokenizer, gen
        self.stages = cfg.stages(model)
        with torch.inference_mode():
            ids = torch.tensor([model.cfg.tts_eos_token_id, model.cfg.tts_pad_token_id], device=cfg.device)
            self.eos, self.pad = model.talker.embed_text(ids)
        self.spec = tts_spec(model.cfg, gen)
        self.holdback = model.code2wav.holdback
        self.role, self.tail = tokenizer.encode(ROLE_TEXT), tokenizer.encode(TAIL_TEXT)

    def reads(self, vocab: Mapping[str, int]) -> None:
        theirs, ours = vocab.get("<|im_end|>"), self.model.cfg.im_end_token_id
        if theirs != ours:
            raise ValueError(f"the reply ends at token {theirs}, the voice model's <|im_end|> is {ours}")
        for token, i in self.tokenizer.backend.get_vocab(with_added_tokens=False).items():
            if vocab.get(token) != i:
                raise ValueError(f"the tokenizers differ: {token!r} is {vocab.get(token)} in the reply's and {i} in "
                                 "the voice model's (a voice reads the reply's token ids; re-tokenizing is not done)")

    def works(self, reply: Reply, options: GenerationOptions) -> list[tuple[Stage, object]]:
        # a conversation's instructions are the writer's system prompt, not a speaking style
        s = TurnSettings.resolve(replace(options, instructions=""), self.spec, self.model.cfg, self.gen)
        speaker = self.model.speaker_row(options.reference_audio, s.speaker)
        language = self.model.cfg.talker.language_id(s.language, s.speaker)
        work = VoiceWork(reply, self.stages[0].kv, self, speaker, language)
        return [(self.stages[0], work), (self.stages[1], Code2WavWork(reply))]


class VoiceWork(FrameWork):
    def __init__(self, turn: Reply, kv: PagedKVCache, voice: TtsVoice, speaker: torch.Tensor | None,
                 language: int | None) -> None:
        super().__init__(turn, kv)
        self.voice, self.speaker, self.language = voice, speaker, language
        self.rows: list[torch.Tensor] = []  # text rows of the reply's tokens embedded so far

    def _readable(self) -> int:
        """Reply tokens that are text: all but a final <|im_end|>."""
        t, ids = self.turn, self.turn.reply_ids
        return len(ids) - int(t.reply_done and bool(ids) and ids[-1] == self.voice.model.cfg.im_end_token_id)

    def _text(self, k: int, n: int) -> torch.Tensor:
        if k >= len(self.rows):
            new = torch.tensor(self.turn.reply_ids[len(self.rows):n], device=self.voice.eos.device)
            self.rows.extend(self.voice.model.talker.embed_text(new).unbind(0))
        return self.rows[k]

    def pending(self) -> int:
        t, v = self.turn, self.voice
        if t.finished or t.talker_done or not t.speaking:
            return 0
        n = self._readable()
        if self.inputs.n == 0:
            if n == 0:
                t.talker_done = t.reply_done  # a reply without text: no speech (Code2Wav then ends the audio)
                return 0
            text = TextIds(v.role + t.reply_ids[:1] + v.tail, [], [])
            self.inputs.append(build_prompt(v.model.talker, v.model.cfg, text, self.language, self.speaker,
                                            streamed=True).embeds)
        if self.next_embed is not None:  # the last input made its frame
            k = self.steps + 1
            if k < n:
                text = self._text(k, n)
            elif not t.reply_done:
                return 0  # ahead of the writer: wait for its next token
            else:
                text = v.eos if k == n else v.pad
            self.feed(text)
        return self.unfed()


def build_voice(model: str, device: str = "cpu", dtype: str | None = None, graphs: bool | None = None) -> TtsVoice:
    """The registry's voice entry point: `model` ('tiny-tts' or a checkpoint directory), its talker cache the
    stage's fixed size (the writer's caches take the memory left once both models are loaded)."""
    cfg = TtsPipelineConfig.on(model, device, dtype, graphs, talker={"kv_blocks": 1024})
    return TtsVoice(*load(model, cfg), cfg)
