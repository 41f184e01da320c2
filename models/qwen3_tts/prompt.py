"""The talker's inputs for one text to read, by the reference's rules (qwen-tts 0.1.1).

Write P(ids) for the talker's projected text embedding and C(id) for its codec embedding; pad, bos, eos
are P of tts_pad, tts_bos, tts_eos. The text is tokenized as `<|im_start|>assistant\\n{text}<|im_end|>\\n
<|im_start|>assistant\\n` (ids[:3] the role, ids[3:-5] the text), an instruction as `<|im_start|>user\\n
{instruction}<|im_end|>\\n`.

Prompt rows, in order:
1. P(instruction ids), when there is one.
2. P(role).
3. The codec tags, each over a text pad and the last over bos: codec [nothink, think_bos, think_eos] (no
   language) or [think, think_bos, language, think_eos], then the speaker (if any), then codec pad.
4. The text rows T = P(text) then eos, over the codec rows K = C(codec_bos). In-context cloning (Base with
   the reference audio's transcript, tokenized as `<|im_start|>assistant\n{transcript}<|im_end|>\n`, ids[3:-2])
   puts P(transcript) before P(text) in T, and appends the reference audio's frames to K, each the sum of its
   16 code embeddings. Streamed: T[i] + K[i] for i < len(K) (T padded with pad to len(K)); decode step k
   adds T[len(K) + k] while T remains, then pad. Whole: T[i] + C(codec_pad) for every row of T, then
   K[j] + pad for every row of K; every decode step adds pad.
Decode step k's input is the sum of frame k's 16 code embeddings plus that text row."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.common.tokenizer import Tokenizer

from .config import TtsConfig
from .talker import Talker

ROLE, TAIL = 3, 5  # <|im_start|>assistant\n ... <|im_end|>\n<|im_start|>assistant\n
REF_TAIL = 2  # <|im_end|>\n


@dataclass(frozen=True)
class TextIds:
    ids: list[int]  # the whole assistant-turn rendering
    instruction: list[int]  # [] for none
    reference: list[int]  # the reference audio's transcript (in-context cloning), [] for none

    @property
    def text(self) -> list[int]:
        return self.ids[ROLE:-TAIL]

    @classmethod
    def of(cls, tokenizer: Tokenizer, text: str, instruction: str = "", reference: str = "") -> TextIds:
        ids = tokenizer.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
        if len(ids) <= ROLE + TAIL:
            raise ValueError("there is no text to read")
        inst = tokenizer.encode(f"<|im_start|>user\n{instruction}<|im_end|>\n") if instruction else []
        ref = tokenizer.encode(f"<|im_start|>assistant\n{reference}<|im_end|>\n")[ROLE:-REF_TAIL] if reference else []
        return cls(ids, inst, ref)


@dataclass(frozen=True)
class TalkerPrompt:
    embeds: torch.Tensor  # [P, H] the prefill
    trailing: torch.Tensor  # [N, H] the text rows of decode steps 0..N-1
    pad: torch.Tensor  # [H] the text row of every later step

    def text_for_step(self, step: int) -> torch.Tensor:
        return self.trailing[step] if step < self.trailing.shape[0] else self.pad


def codec_tags(cfg: TtsConfig, language_id: int | None) -> list[int]:
    t = cfg.talker
    if language_id is None:
        return [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    return [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id]


def embed_frames(talker: Talker, codes: torch.Tensor) -> torch.Tensor:
    """codes [F, 16] -> [F, H]: each frame's 16 code embeddings summed, as the talker reads a frame."""
    cp = talker.code_predictor
    return talker.embed_codec(codes[:, 0]) + sum(cp.embed(codes[:, g], g - 1) for g in range(1, codes.shape[1]))


def build_prompt(talker: Talker, cfg: TtsConfig, text: TextIds, language_id: int | None,
                 speaker: torch.Tensor | None, streamed: bool, reference: torch.Tensor | None = None) -> TalkerPrompt:
    """`speaker`: the speaker's codec row [H] (a named speaker's C(id), or a cloned voice's x-vector);
    `reference`: the reference audio's codes [R, 16] for in-context cloning (its transcript in `text`)."""
    dev = talker.codec_head.weight.device
    ids = lambda xs: torch.tensor(xs, device=dev, dtype=torch.long)  # noqa: E731
    bos, eos, pad = talker.embed_text(ids([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]))
    t = cfg.talker
    codec = talker.embed_codec(ids(codec_tags(cfg, language_id)))
    if speaker is not None:
        codec = torch.cat((codec, speaker[None].to(codec.dtype)))
    codec = torch.cat((codec, talker.embed_codec(ids([t.codec_pad_id]))))
    tags = torch.cat((pad.expand(codec.shape[0] - 1, -1), bos[None])) + codec
    parts = [talker.embed_text(ids(text.instruction))] if text.instruction else []
    parts += [talker.embed_text(ids(text.ids[:ROLE])), tags]
    rows = torch.cat((talker.embed_text(ids([*text.reference, *text.text])), eos[None]))
    codec_rows = talker.embed_codec(ids([t.codec_bos_id]))
    if reference is not None:
        codec_rows = torch.cat((codec_rows, embed_frames(talker, reference.to(dev))))
    n = codec_rows.shape[0]
    if streamed:
        rows = torch.cat((rows, pad.expand(max(0, n - rows.shape[0]), -1)))
        parts.append(rows[:n] + codec_rows)
        trailing = rows[n:]
    else:
        parts += [rows + talker.embed_codec(ids([t.codec_pad_id])), codec_rows + pad]
        trailing = pad[None][:0]
    return TalkerPrompt(torch.cat(parts), trailing, pad)
