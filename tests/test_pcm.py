"""The wire audio codecs (PCM16, G.711) and the resampler (realtime/pcm.py)."""

import math
import warnings

import numpy as np
import pytest
import torch

from realtime.pcm import (
    alaw_decode,
    alaw_encode,
    float_to_g711,
    float_to_int16,
    float_to_pcm16,
    g711_to_float,
    pcm16_to_float,
    resample,
    ulaw_decode,
    ulaw_encode,
)

SR = 16000
ALL_INT16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def tone(freq: float, sr: int, n: int) -> np.ndarray:
    return np.sin(2 * np.pi * freq * np.arange(n) / sr)


def noise(n: int, seed: int, scale: float = 0.1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n) * scale


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resample_on_cuda() -> None:
    for sr_in in (8000, 24_000, 44_100, 48_000):
        x = torch.from_numpy(tone(1000.0, sr_in, 3 * sr_in) + noise(3 * sr_in, 0, 0.3)).float().reshape(3, -1)
        assert (resample(x.cuda(), sr_in, SR).cpu() - resample(x, sr_in, SR)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("sr_in", [8000, 24_000, 44_100, 48_000])
def test_resample_keeps_a_tone(sr_in: int) -> None:
    n = int(1.5 * sr_in)
    out = resample(torch.from_numpy(tone(1000.0, sr_in, n).astype(np.float32)), sr_in, SR)
    assert out.shape == (math.ceil(n * SR / sr_in),) and out.dtype == torch.float32
    middle = slice(800, -800)
    err = (out.double() - torch.from_numpy(tone(1000.0, SR, len(out))))[middle].abs().max().item()
    assert err <= 1e-5


def rms_gain_db(freq: float, sr_in: int) -> float:
    out = resample(torch.from_numpy(tone(freq, sr_in, sr_in).astype(np.float32)), sr_in, SR).double()[800:-800]
    return 20 * math.log10(out.pow(2).mean().sqrt().item() * math.sqrt(2) + 1e-12)


@pytest.mark.parametrize("sr_in", [24_000, 44_100, 48_000])
def test_resample_passband_and_aliasing(sr_in: int) -> None:
    assert all(abs(rms_gain_db(f, sr_in)) <= 0.1 for f in (100.0, 3000.0, 6800.0))
    assert all(rms_gain_db(f, sr_in) <= -70.0 for f in (8400.0, 9000.0, 11_000.0))


def test_resample_upsampling_has_no_images() -> None:
    out = resample(torch.from_numpy(tone(3000.0, 8000, 8000).astype(np.float32)), 8000, SR).double()[800:-800]
    spectrum = torch.fft.rfft(out * torch.hann_window(len(out), dtype=torch.float64)).abs()
    freqs = torch.fft.rfftfreq(len(out), 1 / SR)
    assert 20 * torch.log10(spectrum[freqs > 4200].max() / spectrum.max()).item() <= -70.0


def test_resample_batched_lengths_and_identity() -> None:
    x = torch.randn(3, 2, 4410)
    out = resample(x, 44_100, SR)
    assert out.shape == (3, 2, 1600)
    assert torch.allclose(out[1, 0], resample(x[1, 0], 44_100, SR), atol=1e-6)
    assert resample(x, SR, SR) is x
    assert resample(torch.randn(7), 24_000, SR).shape == (5,)


def test_pcm16_round_trip() -> None:
    data = ALL_INT16.numpy().astype("<i2").tobytes()
    samples = pcm16_to_float(data)
    assert samples.dtype == torch.float32 and samples.min() == -1.0 and samples.max() == 32767 / 32768
    assert float_to_pcm16(samples) == data
    assert float_to_pcm16(torch.tensor([2.0, -2.0])) == np.array([32767, -32768], "<i2").tobytes()


def test_pcm16_bytes_are_the_torch_rounding() -> None:
    """The numpy encoder rounds as torch does: half to even, then clipped (also bf16 and strided views)."""
    halves = (torch.arange(-40, 40) + 0.5) / 32768
    x = torch.cat([torch.randn(20000, generator=torch.Generator().manual_seed(0)) * 0.7, halves,
                   torch.tensor([1.0, -1.0, 0.99999, -1.00001, float(2**-16), -float(2**-16)])])
    for v in (x, x[::3], x.to(torch.bfloat16), x[None, :].T[:, 0]):
        want = torch.round(v.float() * 32768.0).clamp(-32768, 32767).to(torch.int16)
        assert float_to_pcm16(v) == want.numpy().astype("<i2").tobytes() and torch.equal(float_to_int16(v), want)
    assert float_to_pcm16(halves)[:4] == np.array([-40, -38], "<i2").tobytes()  # -39.5 -> -40, -38.5 -> -38


def test_g711_known_values() -> None:
    codes = torch.tensor([0x00, 0x7F, 0x80, 0xFF], dtype=torch.uint8)
    assert ulaw_decode(codes).tolist() == [-32124, 0, 32124, 0]
    assert alaw_decode(torch.tensor([0x2A, 0x55, 0xAA, 0xD5], dtype=torch.uint8)).tolist() == [-32256, -8, 32256, 8]
    loud = torch.tensor([32767, -32768, 0, 1000], dtype=torch.int16)
    assert ulaw_encode(loud).tolist() == [0x80, 0x00, 0xFF, 0xCE]
    assert alaw_encode(loud).tolist() == [0xAA, 0x2A, 0xD5, 0xFA]


def test_g711_round_trips() -> None:
    u = ulaw_decode(ALL_CODES)
    assert torch.equal(ulaw_decode(ulaw_encode(u)), u)
    assert torch.equal(ulaw_encode(u)[ALL_CODES != 0x7F], ALL_CODES[ALL_CODES != 0x7F])
    assert torch.equal(alaw_encode(alaw_decode(ALL_CODES)), ALL_CODES)
    x = 0.5 * torch.from_numpy(tone(440.0, 8000, 8000)).float()
    for law in ("ulaw", "alaw"):
        y = g711_to_float(float_to_g711(x, law), law)
        snr = 10 * torch.log10(x.pow(2).mean() / (y - x).pow(2).mean()).item()
        assert snr >= 35.0


def test_g711_matches_audioop() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    pcm = ALL_INT16.numpy().astype("<i2").tobytes()
    assert ulaw_encode(ALL_INT16).numpy().tobytes() == audioop.lin2ulaw(pcm, 2)
    assert alaw_encode(ALL_INT16).numpy().tobytes() == audioop.lin2alaw(pcm, 2)
    assert ulaw_decode(ALL_CODES).numpy().astype("<i2").tobytes() == audioop.ulaw2lin(bytes(range(256)), 2)
    assert alaw_decode(ALL_CODES).numpy().astype("<i2").tobytes() == audioop.alaw2lin(bytes(range(256)), 2)
