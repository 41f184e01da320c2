"""The Qwen chat template rendered straight to token ids, audio placeholders expanded in place. Text between special
tokens is one piece, as the reference splits the template text at added tokens: the same ids."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from models.common.tokenizer import Tokenizer

Role = Literal["system", "user", "assistant"]
ROLES: tuple[str, ...] = ("system", "user", "assistant")
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
AUDIO_START, AUDIO_PAD, AUDIO_END = "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"


@dataclass(frozen=True)
class Turn:
    """One message. A user turn may carry `audio_tokens` placeholders, rendered before its text."""

    role: Role
    text: str = ""
    audio_tokens: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.audio_tokens < 0:
            raise ValueError(f"audio_tokens must be >= 0, got {self.audio_tokens}")
        if self.audio_tokens and self.role != "user":
            raise ValueError(f"only user turns carry audio, got {self.audio_tokens} audio tokens on {self.role!r}")


@dataclass(frozen=True)
class Prompt:
    """Token ids plus where the audio placeholders sit: (start, length) per audio turn, relative to `ids`."""

    ids: tuple[int, ...]
    audio_spans: tuple[tuple[int, int], ...] = ()

    @property
    def audio_positions(self) -> list[int]:
        return [p for start, n in self.audio_spans for p in range(start, start + n)]

    def __len__(self) -> int:
        return len(self.ids)

    def __add__(self, other: Prompt) -> Prompt:
        shifted = tuple((start + len(self.ids), n) for start, n in other.audio_spans)
        return Prompt(self.ids + other.ids, self.audio_spans + shifted)


def render(tokenizer: Tokenizer, turns: Iterable[Turn], add_generation_prompt: bool = True) -> Prompt:
    """A whole conversation; with `add_generation_prompt` it ends in "<|im_start|>assistant\\n"."""
    special, encode = tokenizer.special_ids, tokenizer.encode
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    for turn in turns:
        ids.append(special[IM_START])
        if turn.audio_tokens:
            ids += [*encode(f"{turn.role}\n"), special[AUDIO_START]]
            spans.append((len(ids), turn.audio_tokens))
            ids += [special[AUDIO_PAD]] * turn.audio_tokens + [special[AUDIO_END], *encode(turn.text)]
        else:
            ids += encode(f"{turn.role}\n{turn.text}")
        ids += [special[IM_END], *encode("\n")]
    if add_generation_prompt:
        ids += [special[IM_START], *encode("assistant\n")]
    return Prompt(tuple(ids), tuple(spans))


def render_continuation(tokenizer: Tokenizer, turns: Iterable[Turn], add_generation_prompt: bool = True) -> Prompt:
    """The new part of a conversation whose cached prefix ends with a generated reply and its <|im_end|>:
    render(history + [reply] + turns) == render(history) + reply ids + <|im_end|> + render_continuation(turns)"""
    return Prompt(tuple(tokenizer.encode("\n"))) + render(tokenizer, turns, add_generation_prompt)

