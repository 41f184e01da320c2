"""What goes into the pipeline (a Turn) and what comes out (events), model-agnostic."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

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


class AudioAhead(Protocol):
    """An audio's encoding made while it arrived: a Message whose `audio` is exactly what was pushed (`holds`)
    encodes only the tail at its turn."""

    def push(self, audio: torch.Tensor) -> None: ...

    def holds(self, audio: torch.Tensor) -> bool: ...

    def fork(self) -> AudioAhead: ...

    def seal(self) -> None:
        """No more audio comes: do now, on the calling thread, what the turn would do on the engine's."""


@dataclass(frozen=True)
class Message:
    """One new message. `audio`: mono float32 PCM at `ModelSpec.input_rate` (user messages only), `ahead` its
    encoding so far; a "tool" message's `text` is a function's output; an assistant's `tool_calls` its calls."""

    role: Role
    text: str = ""
    audio: torch.Tensor | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    ahead: AudioAhead | None = None

    def __post_init__(self) -> None:
        if self.audio is not None and (self.role != "user" or self.audio.dim() != 1):
            raise ValueError("audio must be a 1-D waveform on a user message")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool calls")


@dataclass(frozen=True)
class GenerationOptions:
    """Per-turn settings. `voice`, `language`: declared ones ("" for the default / auto); `instructions`: a speaking
    style; `reference_audio` (mono, output rate) and `reference_text`: a voice to clone. `sampling` overrides
    `ModelSpec.sampling` per stage; `greedy` makes every stage argmax (as the reference's greedy: it may keep a
    repetition penalty)."""

    audio: bool = True
    voice: str = ""
    language: str = ""
    instructions: str = ""
    reference_audio: torch.Tensor | None = None
    reference_text: str = ""
    greedy: bool = False
    max_text_tokens: int = 512
    max_frames: int = 1500
    seed: int = 0
    ignore_eos: bool = False  # benchmarks: never stop early, run to max_text_tokens / max_frames
    background: bool = False  # runs after every foreground turn's work (e.g. input transcription)
    tools: tuple[dict, ...] = ()  # function tools, OpenAI form {"type": "function", "name", "parameters", ...}
    tool_choice: str | dict = "auto"
    sampling: Mapping[str, SamplingParams] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_text_tokens < 1 or self.max_frames < 1:
            raise ValueError("max_text_tokens and max_frames must be >= 1")
        if self.reference_audio is not None and self.reference_audio.dim() != 1:
            raise ValueError("reference_audio must be a 1-D waveform")


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
    """Mono float32 samples in [-1, 1] at `rate` Hz, final (never revised)."""

    turn_id: str
    pcm: np.ndarray
    frames: int  # codec frames decoded so far
    rate: int


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
