"""Code2Wav against transformers, and the incremental decoder (the slot decoder's eager `push`) against
the one-shot decode.

The tiny models' random weights give raw waveforms of amplitude ~100, so most clamped samples sit at
+-1: parity is checked on the waveform before the clamp. In float32 the tolerance is relative (1e-4
of the largest sample); in float64 the stream and the one-shot decode agree to ~1e-11, which shows
the streaming is exact and not merely close.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from models.common.code2wav import Code2Wav, conv_matmul
from models.common.code2wav_batch import Code2WavSlots
from models.common.config import Code2WavConfig
from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.model import load_weights

EXACT = 1e-9  # float64


@dataclass
class Pair:
    cfg: Code2WavConfig
    ours: Code2Wav  # float32
    ours64: Code2Wav
    ref: nn.Module  # transformers' Qwen3OmniMoeCode2Wav, float32
    ref64: nn.Module

    def codes(self, batch: int, frames: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.cfg.codebook_size, (batch, self.cfg.num_quantizers, frames), generator=g)


@pytest.fixture(scope="module")
def c2w(hf_tiny) -> Pair:
    cfg = OmniConfig.from_file(hf_tiny.path).code2wav

    def load(dtype: torch.dtype) -> Code2Wav:
        with torch.device("meta"):
            m = Code2Wav(cfg)
        load_weights(m, hf_tiny.path, prefix="code2wav.", dtype=dtype)
        return m.eval()

    ref = hf_tiny.model.code2wav
    return Pair(cfg, load(torch.float32), load(torch.float64), ref, copy.deepcopy(ref).double())


@torch.no_grad()
def ref_decode(ref: nn.Module, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' output and its waveform before the clamp."""
    seen = {}
    hook = ref.decoder[-1].register_forward_hook(lambda mod, args, out: seen.setdefault("raw", out))
    try:
        wav = ref(codes)
    finally:
        hook.remove()
    return wav, seen["raw"]


def slots(model: Code2Wav, n: int = 1, clamp: bool = False) -> Code2WavSlots:
    return Code2WavSlots(model, n, "cpu", model.code_embedding.weight.dtype, clamp=clamp)


def stream(model: Code2Wav, codes: torch.Tensor, chunks: list[int], clamp: bool = False) -> list[torch.Tensor]:
    """One stream's codes [1, Q, F] pushed in chunks of `chunks` frames -> the pushes' samples, each [1, 1, S]."""
    dec = slots(model, clamp=clamp)
    slot, outs, start = dec.open(), [], 0
    for n in chunks:
        outs.append(dec.push(slot, codes[..., start] if n == 1 else codes[..., start : start + n])[:, None])
        start += n
    assert start == codes.shape[-1]
    return outs


def uneven(frames: int) -> list[int]:
    chunks, pattern = [], [1, 3, 2, 5, 1, 4]
    while sum(chunks) < frames:
        chunks.append(min(pattern[len(chunks) % len(pattern)], frames - sum(chunks)))
    return chunks


def test_holdback_is_555(c2w):
    assert c2w.cfg.samples_per_frame == 1920
    assert c2w.ours.holdback == 555


@pytest.mark.parametrize("frames", [1, 5, 17, 80])
def test_decode_matches_reference(c2w, frames):
    codes = c2w.codes(2, frames, seed=frames)
    with torch.no_grad():
        raw = c2w.ours.decode(codes, clamp=False)
        wav = c2w.ours.decode(codes)
    ref_wav, ref_raw = ref_decode(c2w.ref, codes)
    assert wav.shape == ref_wav.shape == (2, 1, frames * 1920 - 555)
    tol = 1e-4 * ref_raw.abs().max()
    assert (raw - ref_raw).abs().max() <= tol
    assert (wav - ref_wav).abs().max() <= tol
    assert wav.abs().max() <= 1


def test_decode_float64_exact(c2w):
    frames = c2w.cfg.sliding_window + 8
    codes = c2w.codes(1, frames, seed=3)
    with torch.no_grad():
        raw = c2w.ours64.decode(codes, clamp=False)
    _, ref_raw = ref_decode(c2w.ref64, codes)
    assert (raw - ref_raw).abs().max() <= EXACT


def test_next_frame_changes_exactly_the_last_555_samples(c2w):
    frames, k = 6, 3
    codes = c2w.codes(1, frames, seed=4)
    other = codes.clone()
    other[..., k] = c2w.codes(1, 1, seed=5)[..., 0]
    with torch.no_grad():
        a, b = c2w.ours64.decode(codes, clamp=False), c2w.ours64.decode(other, clamp=False)
        prefix = c2w.ours64.decode(codes[..., :k], clamp=False)
    final = k * 1920 - 555
    assert prefix.shape[-1] == final
    assert (prefix - a[..., :final]).abs().max() <= EXACT
    assert (a - b)[..., :final].abs().max() <= EXACT
    assert (a - b)[..., final].abs().min() > 1e-6


def test_stream_frame_by_frame(c2w):
    frames = c2w.cfg.sliding_window + 8
    codes = c2w.codes(1, frames, seed=6)
    dec = slots(c2w.ours64)
    slot, outs = dec.open(), []
    state = [dec.k, dec.v, *dec.tails.values(), *dec.pending.values()]
    shapes = [t.shape for t in state]
    for f in range(frames):
        outs.append(dec.push(slot, codes[..., f])[:, None])
        assert outs[-1].shape[-1] == (1920 - 555 if f == 0 else 1920)
        # the state stays bounded: nothing to the left of the window or the conv contexts is kept
        assert dec.k.shape[2] == c2w.cfg.sliding_window - 1
        assert all(t.shape[-1] == dec.layers[i].context for i, t in dec.tails.items())
        assert all(p.shape[-1] == 1 for p in dec.pending.values())
        assert [t.shape for t in state] == shapes
    got = torch.cat(outs, dim=-1)
    assert got.shape[-1] == frames * 1920 - 555  # the stream, like the one-shot, never yields the last 555
    with torch.no_grad():
        one = c2w.ours64.decode(codes, clamp=False)
    _, ref_raw = ref_decode(c2w.ref64, codes)
    assert (got - one).abs().max() <= EXACT
    assert (got - ref_raw).abs().max() <= EXACT


def test_stream_uneven_chunks_float32(c2w):
    frames = c2w.cfg.sliding_window + 8
    codes = c2w.codes(1, frames, seed=7)
    got = torch.cat(stream(c2w.ours, codes, uneven(frames), clamp=True), dim=-1)
    with torch.no_grad():
        one = c2w.ours.decode(codes)
    ref_wav, ref_raw = ref_decode(c2w.ref, codes)
    tol = 1e-4 * ref_raw.abs().max()
    assert got.shape == one.shape == ref_wav.shape
    assert (got - one).abs().max() <= tol
    assert (got - ref_wav).abs().max() <= tol
    got64 = torch.cat(stream(c2w.ours64, codes, uneven(frames)), dim=-1)
    with torch.no_grad():
        assert (got64 - c2w.ours64.decode(codes, clamp=False)).abs().max() <= EXACT


def test_reopened_slot_starts_a_new_stream(c2w):
    codes, other = c2w.codes(1, 9, seed=8), c2w.codes(1, 4, seed=9)
    fresh = torch.cat(stream(c2w.ours64, codes, [2, 3, 4]), dim=-1)
    dec = slots(c2w.ours64)
    slot = dec.open()
    dec.push(slot, other[..., :3])
    dec.push(slot, other[..., 3])
    dec.close(slot)
    slot = dec.open()
    again = torch.cat([dec.push(slot, codes[..., :2]), dec.push(slot, codes[..., 2:5]), dec.push(slot, codes[..., 5:])],
                      dim=-1)
    assert torch.equal(again[:, None], fresh)


def test_interleaved_streams_equal_each_alone(c2w):
    frames = 9
    codes = c2w.codes(2, frames, seed=10)
    chunks = [1, 3, 2, 3]
    dec = slots(c2w.ours64, 2)
    opened = [dec.open(), dec.open()]
    outs: list[list[torch.Tensor]] = [[], []]
    start = 0
    for n in chunks:  # the two streams take turns, chunk by chunk
        for row, slot in enumerate(opened):
            outs[row].append(dec.push(slot, codes[row : row + 1, :, start : start + n]))
        start += n
    for row in range(2):
        alone = torch.cat(stream(c2w.ours64, codes[row : row + 1], chunks), dim=-1)[:, 0]
        assert (torch.cat(outs[row], dim=-1) - alone).abs().max() <= EXACT


@pytest.mark.parametrize("dilation, bias, strided", [(1, True, False), (3, True, True), (9, False, False)])
def test_conv_matmul_equals_the_conv(dilation, bias, strided):
    """The matmul form some dilated convs take on CUDA (chosen there by timing) computes the conv itself."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(6, 5, 7, dilation=dilation, bias=bias).double()
    x = torch.randn(3, 6, 120, dtype=torch.float64)
    x = x[..., 20:] if strided else x
    with torch.no_grad():
        torch.testing.assert_close(conv_matmul(x, conv), conv(x), rtol=1e-12, atol=1e-12)
