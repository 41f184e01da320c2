"""Code2WavSlots: streams at different points, batched one frame per row, equal each stream's one-shot.

Streams of 1 to window + 8 frames share fewer slots than there are streams (closed slots are reused),
skip ticks at random, and are batched in shuffled order with scratch padding rows in between. Each
stream's concatenated samples must equal `Code2Wav.decode` of its frames and its eager pushes alone:
to ~1e-12 in float64 (so the batching is exact, not merely close), to 1e-4 relative in float32.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from models.common.code2wav import Code2Wav
from models.common.code2wav_batch import Code2WavSlots
from models.common.config import Code2WavConfig
from models.common.weights import random_weights_
from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.tiny import tiny_config

EXACT = 1e-9
BUCKETS = (1, 2, 4, 8)


@dataclass
class Models:
    cfg: Code2WavConfig
    f32: Code2Wav
    f64: Code2Wav

    def codes(self, frames: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.cfg.codebook_size, (1, self.cfg.num_quantizers, frames), generator=g)

    def lengths(self) -> list[int]:
        return [1, 2, 5, self.cfg.sliding_window + 8, 7, 3, 12, 4]


@pytest.fixture(scope="module", params=["a", "b"])
def m(request: pytest.FixtureRequest) -> Models:
    cfg = OmniConfig.from_hf(tiny_config(request.param)).code2wav
    f32, f64 = Code2Wav(cfg).eval(), Code2Wav(cfg).eval()
    random_weights_(f32, seed=1)
    f64.load_state_dict(f32.state_dict())
    return Models(cfg, f32, f64.double())


@dataclass
class Run:
    outs: list[list[torch.Tensor]]
    batches: dict[bool, list[int]] = field(default_factory=lambda: {False: [], True: []})  # real rows per step
    padded: int = 0  # step() calls with padding rows
    eager_first: int = 0  # push() calls at a stream's start
    eager_later: int = 0  # push() calls later in a stream


def run(dec: Code2WavSlots, streams: list[torch.Tensor], seed: int) -> Run:
    """Feed every stream to `dec` through open/push/step/close in a random, seeded interleaving."""
    rng = random.Random(seed)
    result = Run([[] for _ in streams])
    waiting, active = list(range(len(streams))), {}  # active: slot -> [stream, frames pushed]

    def step(rows: list[int], first: bool) -> None:
        rng.shuffle(rows)
        bucket = next(b for b in BUCKETS if b >= len(rows))
        padded = list(rows)
        for _ in range(bucket - len(rows)):
            padded.insert(rng.randint(0, len(padded)), dec.scratch)
        codes = torch.stack([streams[active[r][0]][0, :, active[r][1]] if r in active else streams[0][0, :, 0]
                             for r in padded])
        out = dec.step(torch.tensor(padded), codes, first=first)
        assert out.shape == (bucket, 1920 - 555 * first)
        for i, r in enumerate(padded):
            if r != dec.scratch:
                result.outs[active[r][0]].append(out[i : i + 1])
                active[r][1] += 1
        result.batches[first].append(len(rows))
        result.padded += bucket > len(rows)

    while waiting or active:
        while waiting and len(active) < dec.scratch:
            active[dec.open()] = [waiting.pop(0), 0]
        rows: dict[bool, list[int]] = {False: [], True: []}
        for slot, (s, pos) in list(active.items()):
            codes, left = streams[s], streams[s].shape[-1] - pos
            if rng.random() < 0.25:
                continue
            if rng.random() < (0.5 if pos == 0 else 0.1):
                n = rng.randint(1, min(3, left))
                result.outs[s].append(dec.push(slot, codes[..., pos : pos + n]))
                result.eager_first += pos == 0
                result.eager_later += pos > 0
                active[slot][1] += n
            else:
                rows[pos == 0].append(slot)
        for first, group in rows.items():
            if group:
                step(group, first)
        for slot, (s, pos) in list(active.items()):
            if pos == streams[s].shape[-1]:
                dec.close(slot)
                del active[slot]
    return result


def one_by_one(model: Code2Wav, codes: torch.Tensor) -> torch.Tensor:
    """The stream pushed frame by frame, alone in a decoder of its own (the eager path only)."""
    dec = Code2WavSlots(model, 1, "cpu", model.code_embedding.weight.dtype, clamp=False)
    slot = dec.open()
    return torch.cat([dec.push(slot, codes[..., f]) for f in range(codes.shape[-1])], dim=-1)


def test_interleaved_streams_equal_one_shot_float64(m):
    streams = [m.codes(n, seed=i) for i, n in enumerate(m.lengths())]
    dec = Code2WavSlots(m.f64, 5, "cpu", torch.float64, clamp=False)
    r = run(dec, streams, seed=0)
    assert max(r.batches[False]) >= 2 and min(r.batches[False]) == 1 and r.batches[True] and r.padded
    assert r.eager_first and r.eager_later
    for codes, outs in zip(streams, r.outs, strict=True):
        got = torch.cat(outs, dim=-1)
        with torch.no_grad():
            one = m.f64.decode(codes, clamp=False)[:, 0]
        assert got.shape == one.shape == (1, codes.shape[-1] * 1920 - 555)
        assert (got - one).abs().max() <= EXACT
        assert (got - one_by_one(m.f64, codes)).abs().max() <= EXACT


def test_interleaved_streams_float32(m):
    streams = [m.codes(n, seed=10 + i) for i, n in enumerate(m.lengths())]
    r = run(Code2WavSlots(m.f32, 4, "cpu", torch.float32, clamp=False), streams, seed=1)
    clamped = run(Code2WavSlots(m.f32, 4, "cpu", torch.float32), streams, seed=1)
    for codes, outs, outs_clamped in zip(streams, r.outs, clamped.outs, strict=True):
        with torch.no_grad():
            one = m.f32.decode(codes, clamp=False)[:, 0]
        tol = 1e-4 * one.abs().max()
        assert (torch.cat(outs, dim=-1) - one).abs().max() <= tol
        assert (torch.cat(outs_clamped, dim=-1) - one.clamp(-1, 1)).abs().max() <= tol


def test_close_resets_the_slot(m):
    dec = Code2WavSlots(m.f64, 1, "cpu", torch.float64, clamp=False)
    other, codes = m.codes(6, seed=20), m.codes(4, seed=21)
    slot = dec.open()
    dec.push(slot, other[..., :2])
    dec.step(torch.tensor([slot, dec.scratch]), other[0, :, 2:4].T)
    dec.close(slot)
    buffers = [dec.k[:, slot], dec.v[:, slot], dec.frames[slot], dec.embed_tail[slot],
               *(b[slot] for b in dec.tails.values()), *(b[slot] for b in dec.pending.values())]
    assert all(not b.any() for b in buffers)
    assert dec.open() == slot
    again = [dec.push(slot, codes[..., :1])] + [dec.step(torch.tensor([slot]), codes[:, :, f]) for f in (1, 2, 3)]
    fresh = Code2WavSlots(m.f64, 1, "cpu", torch.float64, clamp=False)
    s = fresh.open()
    first = [fresh.push(s, codes[..., :1])] + [fresh.step(torch.tensor([s]), codes[:, :, f]) for f in (1, 2, 3)]
    assert torch.equal(torch.cat(again, dim=-1), torch.cat(first, dim=-1))


def test_state_is_fixed_size_and_updated_in_place(m):
    dec = Code2WavSlots(m.f32, 2, "cpu", torch.float32)
    state = [dec.k, dec.v, dec.frames, *dec.tails.values(), *dec.pending.values()]
    before = [(t.data_ptr(), t.shape) for t in state]
    slot = dec.open()
    dec.push(slot, m.codes(3, seed=30))
    for f in range(m.cfg.sliding_window + 2):
        dec.step(torch.tensor([dec.scratch, slot]), m.codes(1, seed=31 + f)[:, :, 0].expand(2, -1))
    assert [(t.data_ptr(), t.shape) for t in state] == before
    assert dec.frames[slot] == m.cfg.sliding_window + 5


def test_bad_calls_raise(m):
    dec = Code2WavSlots(m.f32, 2, "cpu", torch.float32)
    codes = m.codes(2, seed=40)
    a, b = dec.open(), dec.open()
    with pytest.raises(RuntimeError, match="in use"):
        dec.open()
    with pytest.raises(ValueError, match="has 0 frames"):
        dec.step(torch.tensor([a]), codes[:, :, 0])
    dec.step(torch.tensor([a, dec.scratch]), codes[0, :, :2].T, first=True)
    dec.push(b, codes[..., :1])
    with pytest.raises(ValueError, match="twice"):
        dec.step(torch.tensor([a, a]), codes[0, :, :2].T)
    with pytest.raises(ValueError, match="has 1 frames"):
        dec.step(torch.tensor([a]), codes[:, :, 1], first=True)
    with pytest.raises(ValueError, match="expected"):
        dec.step(torch.tensor([a, b]), codes[:, :, 0])
    with pytest.raises(ValueError, match="expected"):
        dec.push(a, codes.expand(2, -1, -1))
    dec.close(a)
    with pytest.raises(ValueError, match="not open"):
        dec.close(a)
    with pytest.raises(ValueError, match="not open"):
        dec.push(a, codes[..., :1])
    with pytest.raises(ValueError, match="not open"):
        dec.step(torch.tensor([a]), codes[:, :, 1])
    with pytest.raises(ValueError, match="float64"):
        Code2WavSlots(m.f32, 2, "cpu", torch.float64)


def test_bfloat16_smoke(m):
    model = Code2Wav(m.cfg).eval()
    model.load_state_dict(m.f32.state_dict())
    model = model.to(torch.bfloat16)
    codes = m.codes(6, seed=50)
    try:
        with torch.no_grad():
            one = model.decode(codes, clamp=False)[:, 0].float()
    except RuntimeError as e:  # a CPU build without bf16 convs
        pytest.skip(f"bf16 Code2Wav does not run on this CPU: {e}")
    r = run(Code2WavSlots(model, 2, "cpu", torch.bfloat16, clamp=False), [codes, m.codes(3, seed=51)], seed=2)
    got = torch.cat(r.outs[0], dim=-1).float()
    assert got.shape == one.shape and got.isfinite().all()
    assert (got - one).abs().max() <= 0.05 * one.abs().max()


class SplitEmbedding(nn.Module):
    """Another codec's code embedding through Code2Wav's hook: codebook 0 and the rest from two tables,
    summed (as a split residual VQ embeds them)."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.first = nn.Embedding(cfg.codebook_size, cfg.hidden_size)
        self.rest = nn.Embedding(cfg.codebook_size, cfg.hidden_size)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return (self.first(codes[:, 0]) + self.rest(codes[:, 1:]).sum(1)) / codes.shape[1]


def test_a_codec_with_its_own_code_embedding_streams_exactly(m):
    own = Code2Wav(m.cfg, code_embedding=SplitEmbedding(m.cfg)).eval()
    random_weights_(own, seed=2)
    own = own.double()
    assert "code_embedding.first.weight" in dict(own.named_parameters())
    streams = [m.codes(n, seed=30 + i) for i, n in enumerate(m.lengths())]
    r = run(Code2WavSlots(own, 3, "cpu", torch.float64, clamp=False), streams, seed=3)
    for codes, outs in zip(streams, r.outs, strict=True):
        with torch.no_grad():
            one = own.decode(codes, clamp=False)[:, 0]
            split = own.code_embedding
            embedded = (split.first(codes[:, 0]) + split.rest(codes[:, 1:]).sum(1)) / codes.shape[1]
        got = torch.cat(outs, dim=-1)
        assert got.shape == one.shape
        assert (got - one).abs().max() <= EXACT
        assert torch.equal(own.embed(codes), embedded)  # the hook's embedding is the one decoded
