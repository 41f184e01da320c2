"""What goes into the pipeline (a Turn) and what comes out (events), model-agnostic."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from .sampling import SamplingParams

Role = Literal["system", "user", "assistant", "tool"]
_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):06d}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON object, as text
    call_id: str = ""


@dataclass(frozen=True)
class Message:
    """One new message of a conversation. `audio`: mono float32 PCM at 16 kHz, user messages only.
    A "tool" message carries a function's output as `text`; an assistant message may carry the tool
    calls it made (history re-sent after a reset)."""

    role: Role
    text: str = ""
    audio: torch.Tensor | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    def __post_init__(self) -> None:
        if self.audio is not None and (self.role != "user" or self.audio.dim() != 1):
            raise ValueError("audio must be a 1-D 16 kHz waveform on a user message")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool calls")


@dataclass(frozen=True)
class GenerationOptions:
    """Per-turn settings. Sampling defaults are the reference's (talker top-k 50, temperature 0.9,
    repetition penalty 1.05; code predictor top-k 50, top-p 0.8); `greedy` makes every stage argmax
    (the talker keeps its repetition penalty and suppressed ids, as the reference does)."""

    audio: bool = True
    speaker: str = "ethan"
    greedy: bool = False
    max_text_tokens: int = 512
    max_frames: int = 1500
    seed: int = 0
    ignore_eos: bool = False  # benchmarks: never stop early, run to max_text_tokens / max_frames
    background: bool = False  # runs after every foreground turn's work (e.g. input transcription)
    tools: tuple[dict, ...] = ()  # function tools, OpenAI form {"type": "function", "name", "parameters", ...}
    tool_choice: str | dict = "auto"
    thinker: SamplingParams | None = None  # None: the checkpoint's generation_config (greedy if none)
    talker: SamplingParams = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05)
    predictor: SamplingParams = SamplingParams(top_k=50, top_p=0.8)

    def __post_init__(self) -> None:
        if self.max_text_tokens < 1 or self.max_frames < 1:
            raise ValueError("max_text_tokens and max_frames must be >= 1")


@dataclass
class Turn:
    """New messages for a session; the session's earlier turns stay cached in the pipeline."""

    session_id: str
    messages: list[Message]
    options: GenerationOptions = field(default_factory=GenerationOptions)
    turn_id: str = field(default_factory=lambda: new_id("turn"))


@dataclass(frozen=True)
class TextDelta:
    turn_id: str
    text: str
    token_ids: tuple[int, ...]
    tool_call: bool = False  # part of a tool call: not speech, not a transcript


@dataclass(frozen=True)
class AudioChunk:
    """24 kHz mono float32 samples in [-1, 1], final (never revised)."""

    turn_id: str
    pcm: np.ndarray
    frames: int  # codec frames decoded so far


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    audio_frames: int
    audio_input_tokens: int = 0  # of input_tokens, those that carry audio


@dataclass(frozen=True)
class TurnDone:
    turn_id: str
    status: Literal["completed", "cancelled", "length"]
    text: str
    text_ids: tuple[int, ...]
    codes: tuple[tuple[int, ...], ...]  # frames x codebooks
    usage: Usage
    timings: dict[str, float]
    tool_calls: tuple[ToolCall, ...] = ()
    invalid_tool_calls: tuple[str, ...] = ()  # tool-call blocks whose JSON did not parse


@dataclass(frozen=True)
class TurnError:
    turn_id: str
    code: str
    message: str


Event = TextDelta | AudioChunk | TurnDone | TurnError
