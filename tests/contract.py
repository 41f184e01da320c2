"""Turns and outcomes for the model contract tests, built from what a model declares (its ModelSpec) alone.

Nothing here names a model: a turn hears noise at `spec.input_rate` if the model hears, asks for speech if
it speaks, and samples every stage the spec lists when it is not greedy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import torch

from pipelines.pipeline import Pipeline
from pipelines.sampling import SamplingParams
from pipelines.spec import ModelSpec
from pipelines.types import AudioChunk, Event, GenerationOptions, Message, TextDelta, Turn, TurnDone

SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)


def user(spec: ModelSpec, text: str, seconds: float = 0.0, seed: int = 0) -> Message:
    """A user message: `text`, plus `seconds` of noise at the model's input rate if it hears."""
    audio = None
    if spec.hears and seconds:
        g = torch.Generator().manual_seed(seed)
        audio = torch.randn(int(seconds * spec.input_rate), generator=g) * 0.1
    return Message("user", text, audio)


def options(spec: ModelSpec, seed: int | None = None, **kw) -> GenerationOptions:
    """Greedy (seed None), or every stage the spec lists sampled with `seed`; speech when the model speaks."""
    base: dict = dict(audio=spec.speaks, max_text_tokens=5, max_frames=3)
    if seed is None:
        base["greedy"] = True
    else:
        base |= dict(seed=seed, sampling={name: SAMPLED for name in spec.sampling})
    return GenerationOptions(**(base | kw))


@dataclass
class Outcome:
    """Everything a turn gave back, in a form two runs can be compared by."""

    status: str
    text_ids: tuple[int, ...]
    codes: tuple[tuple[int, ...], ...]
    deltas: list[tuple[int, ...]]  # each TextDelta's token ids, in order
    chunks: list[tuple[int, int, int]]  # each AudioChunk's (frames, samples, rate), in order
    pcm: np.ndarray

    def same_tokens(self, other: Outcome) -> bool:
        return (self.status, self.text_ids, self.codes, self.deltas, self.chunks) == (
            other.status, other.text_ids, other.codes, other.deltas, other.chunks)


def outcome(events: list[Event]) -> Outcome:
    done = events[-1]
    assert isinstance(done, TurnDone), done
    audio = [e for e in events if isinstance(e, AudioChunk)]
    pcm = np.concatenate([e.pcm for e in audio]) if audio else np.zeros(0, np.float32)
    return Outcome(done.status, done.text_ids, done.codes, [e.token_ids for e in events if isinstance(e, TextDelta)],
                   [(e.frames, len(e.pcm), e.rate) for e in audio], pcm)


async def collect(p: Pipeline, turn: Turn) -> list[Event]:
    return [e async for e in p.submit(turn)]


def together(p: Pipeline, turns: list[Turn]) -> list[list[Event]]:
    """Submit every turn at once; each turn's events."""

    async def go() -> list[list[Event]]:
        return await asyncio.gather(*(collect(p, t) for t in turns))

    return asyncio.run(go())


def steps(p: Pipeline) -> int:
    """Batches run so far, over every stage (read once the engine is idle)."""
    p.sync()
    return sum(s.runner.steps for s in p.stages)


def live(p: Pipeline) -> dict:
    """The engine's counters less the running totals: what every finished turn and ended session must return
    to its starting point (turns, sessions, works, KV blocks, stream slots, ...)."""
    p.sync()
    stats = p.stats()
    assert stats["turns_started"] == stats["turns_ended"] + stats["turns_active"], stats
    return {k: v for k, v in stats.items() if k not in ("turns_started", "turns_ended")}
