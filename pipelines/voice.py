"""A voice: one model's speaking stages (frame LM and codec) voicing the replies another model writes, reading
each reply token as it is made (models/registry.py pairs them; the writer runs these stages in place of its own)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from .spec import ModelSpec
from .stage import Stage
from .types import GenerationOptions


class Reply(Protocol):
    """What a voice reads of the writer's turn; its stages also fill the turn's speaking fields (codes, frames and
    audio: models/common/speaking.SpeakingState) and read its resolved `options` (sampling, max_frames)."""

    reply_ids: list[int]  # the reply's tokens so far
    reply_done: bool  # no token follows
    speaking: bool  # False: this reply is not spoken (a tool call)


class Voice(Protocol):
    spec: ModelSpec  # what it speaks: rates, voices, languages, cloning, its stages' sampling
    stages: list[Stage]  # in pipeline order, after the writer's
    holdback: int  # samples at the end of each frame's audio that wait for the next frame

    def reads(self, vocab: Mapping[str, int]) -> None:
        """ValueError unless the writer's token ids (`vocab`: token -> id) mean the same text to this voice."""

    def works(self, reply: Reply, options: GenerationOptions) -> list[tuple[Stage, object]]:
        """Its works speaking `reply`; ValueError for options it cannot take (an unknown voice, say)."""


def spoken_by(writer: ModelSpec, voice: ModelSpec) -> ModelSpec:
    """The writer's spec with the voice's speech: rates, frame length, voices, languages, cloning, sampling."""
    return replace(writer, output_rate=voice.output_rate, frame_samples=voice.frame_samples, voices=voice.voices,
                   default_voice=voice.default_voice, languages=voice.languages, clones=voice.clones,
                   sampling={**writer.sampling, **voice.sampling})
