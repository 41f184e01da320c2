"""The thinker's decode overlapping the later stages (StageConfig.overlap: on CUDA each stage on a stream of its
own, its graphs captured there in a pool of their own) gives the replies the stages give one after another:
several concurrent greedy turns, text ids and codec codes equal, audio equal to Code2Wav's batch rounding. On
CPU this checks the round order; on a GPU, that stages side by side do not corrupt each other."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from models.registry import build_pipeline
from pipelines.types import AudioChunk, GenerationOptions, Message, Turn, TurnDone

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
OPTS = GenerationOptions(greedy=True, max_text_tokens=10, max_frames=8)


def turns() -> list[Turn]:
    g = torch.Generator().manual_seed(3)
    return [Turn(f"s{i}", [Message("user", "", torch.randn(int(s * 16000), generator=g) * 0.1)], OPTS)
            for i, s in enumerate([0.7, 1.4, 2.2, 1.0])]


async def _all(pipeline, ts: list[Turn]) -> list[list]:
    async def one(t: Turn) -> list:
        return [e async for e in pipeline.submit(t)]
    return await asyncio.gather(*(one(t) for t in ts))


def replies(device: str, overlap: bool) -> tuple[list, dict]:
    kv = 1.0 if device == "cuda" else None  # sized from free memory, the second build would find the first's
    with build_pipeline("tiny", device=device, kv_memory_gib=kv, thinker={"overlap": overlap}) as pipeline:
        assert pipeline.program.by_name["thinker"].cfg.overlap is overlap
        out = []
        for events in asyncio.run(_all(pipeline, turns())):
            done = events[-1]
            assert isinstance(done, TurnDone), done
            wav = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
            out.append((done.text_ids, done.codes, wav))
        pipeline.sync()
        return out, pipeline.stats()


@pytest.mark.parametrize("device", DEVICES)
def test_the_overlapping_thinker_gives_the_replies_of_stages_one_after_another(device):
    together, stats = replies(device, True)
    apart, _ = replies(device, False)
    assert stats["turns_started"] == stats["turns_ended"] == 4 and stats["turns_active"] == 0
    for (ids_a, codes_a, wav_a), (ids_b, codes_b, wav_b) in zip(together, apart, strict=True):
        assert len(ids_a) > 1 and len(codes_a) > 1
        assert ids_a == ids_b and codes_a == codes_b
        assert np.isfinite(wav_a).all()
        np.testing.assert_allclose(wav_a, wav_b, atol=5e-3)  # Code2Wav's rounding differs with its batch size
