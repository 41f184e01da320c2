"""Whole-turn forms of what the pipeline computes step by step, used only to check it against the reference."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from models.common.chat import IM_END
from models.common.frame import CodecFrame
from models.common.tokenizer import _ADDED_FLAGS, Tokenizer
from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.talker import Talker
from models.qwen3_omni.talker_prompt import TtsEmbeds, assistant_prefix, user_mask
from models.qwen3_omni.tools import _BLOCK, tool_response_text


def text_positions(
    batch: int, length: int, start: int | torch.Tensor = 0, device: torch.device | None = None
) -> torch.Tensor:
    """mrope positions [3, B, T] for `length` text/audio tokens that follow `start` earlier tokens of the
    session (an int, or a [B] tensor when rows have different histories): start..start+T-1 on all rows."""
    offset = torch.as_tensor(start, device=device).reshape(-1, 1)
    pos = torch.arange(length, device=offset.device)[None, :] + offset
    return pos.expand(batch, length)[None].expand(3, batch, length)


def tool_responses_text(outputs: Iterable[str]) -> str:
    """The content of the one user turn that carries consecutive function results."""
    return "\n".join(tool_response_text(o) for o in outputs)


def strip_tool_calls(text: str) -> str:
    """Model output without its tool-call blocks (valid or not), stripped of surrounding whitespace."""
    return _BLOCK.sub("", text).strip()


@dataclass(frozen=True)
class TalkerPrompt:
    embeds: torch.Tensor  # [P, H] prefill input
    trailing: torch.Tensor  # [N, H] text part of decode steps 0..N-1 (reply tokens 1.., then eos)
    pad: torch.Tensor  # [H] text part of every later step

    def text_for_step(self, step: int) -> torch.Tensor:
        return self.trailing[step] if step < self.trailing.shape[0] else self.pad


def user_part(
    talker: Talker, cfg: OmniConfig, input_ids: torch.Tensor, thinker_embeds: torch.Tensor, thinker_hidden: torch.Tensor
) -> torch.Tensor:
    """[U, H]: the user turns of `input_ids` [L]; thinker_embeds / thinker_hidden: [>= L, H_thinker]."""
    keep = user_mask(input_ids, cfg)
    audio = (input_ids == cfg.thinker.audio_token_id)[keep]
    text = talker.project_text(thinker_embeds[: input_ids.shape[0]][keep])
    hidden = talker.project_hidden(thinker_hidden[: input_ids.shape[0]][keep])
    return torch.where(audio[:, None], hidden, text)


def assistant_start(input_ids: torch.Tensor, cfg: OmniConfig) -> int:
    """Index of the last `<|im_start|>assistant` in `input_ids` [L]."""
    hits = (input_ids[:-1] == cfg.im_start_token_id) & (input_ids[1:] == cfg.assistant_token_id)
    idx = hits.nonzero().flatten()
    if idx.numel() == 0:
        raise ValueError("the thinker prompt has no <|im_start|>assistant turn")
    return int(idx[-1])


def build_prompt(
    talker: Talker,
    cfg: OmniConfig,
    input_ids: torch.Tensor,
    thinker_embeds: torch.Tensor,
    thinker_hidden: torch.Tensor,
    tts: TtsEmbeds,
    speaker_id: int,
) -> TalkerPrompt:
    """The whole talker input of one turn, once the thinker's reply is known (the rules are
    models/qwen3_omni/talker_prompt.py's docstring).

    input_ids [L]: the thinker prompt. thinker_embeds [L + R, H_thinker]: the thinker's input embeddings
    of the prompt and of the R >= 1 reply tokens it consumed (not its final token). thinker_hidden
    [>= L, H_thinker]: the hidden states entering layer `accept_hidden_layer`, over the prompt.
    """
    start = assistant_start(input_ids, cfg)
    if thinker_embeds.shape[0] < start + 4:
        raise ValueError("the talker needs the thinker's first reply token")
    users = user_part(talker, cfg, input_ids, thinker_embeds, thinker_hidden)
    prefix = assistant_prefix(talker, cfg, thinker_embeds[start : start + 4], tts, speaker_id)
    trailing = torch.cat((talker.project_text(thinker_embeds[start + 4 :]), tts.eos[None]))
    return TalkerPrompt(torch.cat((users, prefix)), trailing, tts.pad)


def next_input(frame: CodecFrame, text: torch.Tensor) -> torch.Tensor:
    """[B, 1, H]: the talker's input for the step after `frame`, with text [B, H] (or [H]) from
    `TalkerPrompt.text_for_step`."""
    return (frame.embed_sum + text)[:, None]


def reply_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """A reply's text re-encoded, then <|im_end|>: what render() puts after "assistant\n", unless the text starts
    with whitespace holding a newline (that would merge with the template's newline). Sampled ids may differ."""
    return [*tokenizer.encode(text), tokenizer.special_ids[IM_END]]


def save_tokenizer(tok: Tokenizer, path: str | Path) -> None:
    """Write tokenizer.json, vocab.json, merges.txt and tokenizer_config.json (loadable by transformers)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(path / "tokenizer.json"))
    model = json.loads(tok.backend.to_str())["model"]
    (path / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = tok.backend.get_added_tokens_decoder()
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": {
            str(i): {"content": t.content, **{k: getattr(t, k) for k in _ADDED_FLAGS}}
            for i, t in sorted(added.items())
        },
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
