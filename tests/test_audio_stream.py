"""Encode while speaking: pushing audio piece by piece, then finishing, equals log-mel + encoder on the
whole buffer (to float32 rounding: a matmul of another width may round a last bit differently); and the
commit encodes only the tail."""

from __future__ import annotations

import copy

import pytest
import torch

from models.qwen3_omni.audio_encoder import AudioEncoder
from models.qwen3_omni.audio_features import log_mel
from models.qwen3_omni.audio_stream import AudioStream, finish_all
from models.qwen3_omni.config import AudioEncoderConfig
from models.qwen3_omni.encoder_graph import EncoderGraph
from models.qwen3_omni.tiny import tiny_config

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tower() -> AudioEncoder:
    cfg = AudioEncoderConfig.from_hf(tiny_config("a")["thinker_config"]["audio_config"])
    torch.manual_seed(0)
    enc = AudioEncoder(cfg).eval()
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.2)
    return enc


def speech(seconds: float, seed: int, louder_at: float | None = None) -> torch.Tensor:
    """Noise bursts with silent gaps (the log-mel floor matters), optionally much louder from `louder_at`."""
    g = torch.Generator().manual_seed(seed)
    n = int(seconds * 16000)
    x = torch.randn(n, generator=g) * 0.05
    gate = (torch.arange(n) // 4000) % 3 != 2  # every third quarter second is silence
    x = x * gate
    if louder_at is not None:
        x[int(louder_at * 16000):] *= 40.0
    return x


def whole(tower: AudioEncoder, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    feats, mask = log_mel([audio])
    feats = feats[0, :, : int(mask.sum())]
    with torch.inference_mode():
        return feats, tower(feats)


def streamed(tower: AudioEncoder, audio: torch.Tensor, piece: int) -> tuple[AudioStream, torch.Tensor, torch.Tensor]:
    stream = AudioStream(tower)
    for start in range(0, audio.numel(), piece):
        stream.push(audio[start : start + piece])
    return stream, *stream.finish()


@pytest.mark.parametrize(("seconds", "piece", "louder_at"), [
    (0.7, 480, None),  # shorter than a chunk: nothing final, the whole call
    (3.0, 480, None),  # 20 ms pieces (a 24 kHz client's 30 ms after resampling is 480 samples)
    (3.05, 1600, None),
    (20.0, 3200, None),  # two full attention windows final before the commit
    (20.0, 2400, 12.5),  # the floor rises late: stale chunks and windows are re-encoded
    (17.0, 16000 * 17, None),  # all at once: nothing before the commit
])
def test_streamed_equals_whole_buffer(tower, seconds, piece, louder_at):
    audio = speech(seconds, int(seconds * 10), louder_at)
    feats, out = whole(tower, audio)
    stream, s_feats, s_out = streamed(tower, audio, piece)
    # float32 matmuls of different widths may round the last bit differently (mel projection, encoder)
    torch.testing.assert_close(s_feats, feats, rtol=0, atol=1e-6)
    assert s_out.shape == out.shape
    torch.testing.assert_close(s_out, out, rtol=1e-5, atol=1e-5)


def test_streams_finished_together_equal_each_finished_alone(tower):
    """The engine finishes every committed stream of a step in one transformer call (EncoderStep): each output
    is what its own finish gives, and the whole buffer's, for a short, a mid and a windowed audio."""
    audios = [speech(s, 7 + i) for i, s in enumerate((0.6, 3.0, 2.2, 18.5))]
    streams = [AudioStream(tower) for _ in audios]
    for stream, audio in zip(streams, audios, strict=True):
        for start in range(0, audio.numel(), 3200):
            stream.push(audio[start : start + 3200])
    alone = [s.fork().finish()[1] for s in streams]
    with torch.inference_mode():
        together = finish_all(tower, [s.finish_parts()[1] for s in streams])
    assert [t.shape for t in together] == [a.shape for a in alone]
    for t, a, audio in zip(together, alone, audios, strict=True):
        torch.testing.assert_close(t, a, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(t, whole(tower, audio)[1], rtol=1e-5, atol=1e-5)
    assert streams[3].cached_windows == 2  # 16 s of it was final before the commit: only its tail ran together


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a GPU"))])
def test_the_fixed_shape_encoder_step_equals_the_packed_one(tower, device):
    """EncoderGraph (the tails' transformer call on the window grid, padded to a window bucket; CUDA graphs on the
    GPU) gives what the packed call gives, for tails of one to several windows, more than one bucket's worth too."""
    tower = copy.deepcopy(tower).to(device)
    graph = EncoderGraph(tower, torch.float32, torch.device(device), graphs=device == "cuda")
    graph.capture(None)
    w = graph.runner.spec["mask"].shape[0]
    torch.manual_seed(1)
    for frames in ([40], [100, 250, 37], [60] * 20, [800, 1600, 130] + [60] * 70):  # 1, 3, 20, 74 windows (>64: packed)
        tokens = sum(int(tower.token_count(f)) for f in frames)
        x = torch.randn(tokens, tower.cfg.d_model, device=device)
        with torch.inference_mode():
            packed = tower.transform(x, frames, graph.chunk_tokens)
            fixed = graph(x, frames)
        assert tower.windows(frames, graph.chunk_tokens, device)[1].shape[1] == w
        torch.testing.assert_close(fixed, packed, rtol=1e-4, atol=1e-4)


def test_a_sealed_stream_hands_its_parts_over_once_and_equal_to_unsealed(tower):
    """`seal` (the audio worker, at the commit) runs finish_parts; the encoder step's call then takes that result,
    equal to a twin's computed then, and computes nothing (its inputs moved on: a recompute would show)."""
    audio = speech(3.05, 6)
    stream = AudioStream(tower)
    for start in range(0, audio.numel(), 1600):
        stream.push(audio[start : start + 1600])
    twin = stream.fork()
    stream.seal()
    stream.raw = stream.raw[:, :0]  # what finish_parts would redo from is gone: only the sealed parts can answer
    features, tail = stream.finish_parts()
    want_features, want_tail = twin.finish_parts()
    torch.testing.assert_close(features, want_features, rtol=0, atol=0)
    with torch.inference_mode():
        torch.testing.assert_close(finish_all(tower, [tail])[0], finish_all(tower, [want_tail])[0])
    assert stream._sealed is None and twin._sealed is None  # used once; a fork never shares them
    tiny = AudioStream(tower)
    tiny.push(torch.zeros(100))
    tiny.seal()  # too short for log-mel: nothing to do, and no error (the turn fails it with a clear message)
    assert tiny._sealed is None


def test_final_parts_are_encoded_before_the_commit(tower):
    audio = speech(20.0, 3)
    stream = AudioStream(tower)
    for start in range(0, audio.numel(), 3200):
        stream.push(audio[start : start + 3200])
    assert stream.cached_windows == 2 and stream.cached_chunks >= 19  # 16 s of windows, 19 s of chunks
    late = speech(10.0, 4, louder_at=9.0)
    stream = AudioStream(tower)
    for start in range(0, late.numel(), 3200):
        stream.push(late[start : start + 3200])
    assert stream.cached_windows == 1 and stream.cached_chunks >= 9
    assert {f for _, f in stream.chunks} == {stream._floor()}  # every chunk re-encoded with the new floor


def test_a_turn_encoded_ahead_answers_as_one_encoded_at_its_start():
    """Through the pipeline: the message carries its AudioStream (Pipeline.audio_ahead) and gets the same
    reply as the same audio without; an AudioStream that does not hold the message's audio is not used."""
    import asyncio

    from models.qwen3_omni.placement import PipelineConfig
    from models.qwen3_omni.program import build_pipeline
    from pipelines.types import GenerationOptions, Message, Turn

    opts = GenerationOptions(greedy=True, max_text_tokens=6, max_frames=4)
    audio = speech(2.6, 5)

    async def reply(p, session: str, ahead) -> tuple:
        events = [e async for e in p.submit(Turn(session, [Message("user", "", audio, ahead=ahead)], opts))]
        return events[-1].text_ids, events[-1].codes, events[-1].usage

    with build_pipeline(PipelineConfig()) as p:
        ahead = p.audio_ahead()
        for start in range(0, audio.numel(), 480):
            ahead.push(audio[start : start + 480])
        assert ahead.cached_chunks == 2
        other = p.audio_ahead()
        other.push(audio[:16000])  # not this message's audio
        plain = asyncio.run(reply(p, "plain", None))
        assert asyncio.run(reply(p, "ahead", ahead)) == plain
        assert asyncio.run(reply(p, "other", other)) == plain
