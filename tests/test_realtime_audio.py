"""Realtime audio formats: config parsing, decode/encode round trips, G.711 values, streaming output encoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from realtime.audio import AudioFormat, OutputEncoder, TimeStretch, decode, encode, to_model_rate
from tests.speech import speech_like

PCM = AudioFormat.from_config({"type": "audio/pcm", "rate": 24000})
PCMU = AudioFormat.from_config({"type": "audio/pcmu"})
PCMA = AudioFormat.from_config({"type": "audio/pcma"})
MODEL_IN, MODEL_OUT = 16000, 24000  # a model hearing 16 kHz and speaking 24 kHz (the tiny preset's rates)


def _tone(hz: float, sr: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * hz * np.arange(round(sr * seconds)) / sr)).astype(np.float32)


def test_from_config_and_errors() -> None:
    assert PCM == AudioFormat("audio/pcm", 24000) == AudioFormat.from_config({"type": "audio/pcm"})
    assert PCMU.rate == PCMA.rate == 8000
    assert AudioFormat.from_config("g711_ulaw") == PCMU and AudioFormat.from_config("pcm16") == PCM
    assert PCM.to_config() == {"type": "audio/pcm", "rate": 24000} and PCMA.to_config() == {"type": "audio/pcma"}
    assert PCM.bytes_per_sample == 2 and PCMU.bytes_per_sample == PCMA.bytes_per_sample == 1
    with pytest.raises(ValueError, match="only rate 24000"):
        AudioFormat.from_config({"type": "audio/pcm", "rate": 16000})
    with pytest.raises(ValueError, match="only rate 8000"):
        AudioFormat.from_config({"type": "audio/pcmu", "rate": 24000})
    with pytest.raises(ValueError, match="unsupported audio format type 'audio/opus'"):
        AudioFormat.from_config({"type": "audio/opus"})
    with pytest.raises(ValueError, match="unknown audio format field"):
        AudioFormat.from_config({"type": "audio/pcm", "channels": 2})


def test_pcm_round_trip_is_exact_and_odd_length_fails() -> None:
    data = np.random.default_rng(0).integers(-32768, 32768, 5000, dtype=np.int16).astype("<i2").tobytes()
    x = decode(data, PCM)
    assert x.dtype == torch.float32 and x.shape == (5000,)
    assert encode(x, PCM, MODEL_OUT) == data and encode(x.numpy(), PCM, MODEL_OUT) == data
    with pytest.raises(ValueError, match="odd byte count"):
        decode(data[:-1], PCM)


def test_g711_known_values() -> None:
    ulaw = decode(bytes([0xFF, 0x7F, 0x80, 0x00, 0xEF]), PCMU) * 32768
    assert ulaw.tolist() == [0, 0, 32124, -32124, 132]
    alaw = decode(bytes([0xD5, 0x55, 0xAA, 0x2A]), PCMA) * 32768
    assert alaw.tolist() == [8, -8, 32256, -32256]
    assert encode(np.zeros(600, np.float32), PCMU, MODEL_OUT) == b"\xff" * 200
    assert encode(np.zeros(600, np.float32), PCMA, MODEL_OUT) == b"\xd5" * 200


@pytest.mark.parametrize("fmt", [PCMU, PCMA], ids=["pcmu", "pcma"])
def test_g711_round_trip(fmt: AudioFormat) -> None:
    x24 = _tone(440.0, 24000, 0.5)
    codes = encode(x24, fmt, MODEL_OUT)
    assert len(codes) == 4000
    y8 = decode(codes, fmt)
    ideal = torch.from_numpy(_tone(440.0, 8000, 0.5))
    core = slice(100, -100)  # away from the resampler's zero-padded edges
    snr = 10 * torch.log10(ideal[core].square().sum() / (y8[core] - ideal[core]).square().sum())
    assert snr > 30.0  # G.711 gives ~38 dB on a loud tone
    assert encode(torch.zeros(0), fmt, MODEL_OUT) == b"" and decode(b"", fmt).shape == (0,)
    assert to_model_rate(torch.zeros(0), fmt, MODEL_IN).shape == (0,)


@pytest.mark.parametrize("fmt", [PCM, PCMU, PCMA], ids=["pcm", "pcmu", "pcma"])
def test_to_model_rate(fmt: AudioFormat) -> None:
    x = torch.from_numpy(_tone(300.0, fmt.rate, 0.5))
    y = to_model_rate(x, fmt, MODEL_IN)
    assert y.shape == (8000,)
    ideal = torch.from_numpy(_tone(300.0, 16000, 0.5))
    assert (y - ideal)[200:-200].abs().max() < 1e-3


def _chunked(fmt: AudioFormat, x: np.ndarray, sizes: list[int], rate: int = MODEL_OUT) -> bytes:
    enc, out, i = OutputEncoder(fmt, rate), [], 0
    for k in range(len(x)):
        if i >= len(x):
            break
        out.append(enc.push(x[i : i + sizes[k % len(sizes)]]))
        i += sizes[k % len(sizes)]
    return b"".join(out) + enc.flush()


@pytest.mark.parametrize("fmt", [PCM, PCMU, PCMA], ids=["pcm", "pcmu", "pcma"])
def test_chunked_output_equals_whole(fmt: AudioFormat) -> None:
    x = speech_like(1.0, 24000, seed=3) * 2 + _tone(3700.0, 24000, 1.0, 0.05)  # loud, with energy near 4 kHz
    whole = encode(x, fmt, MODEL_OUT)
    sizes = [1, 7, 13, 480, 1920, 3, 2000, 121]
    chunked = _chunked(fmt, x, sizes)
    assert len(chunked) == len(whole)
    a, b = decode(whole, fmt), decode(chunked, fmt)
    differing = int((a != b).sum())
    # Measured: identical bytes (0 differing codes); allow one code step on 0.1% of samples for float reordering.
    assert differing <= len(a) // 1000
    assert (a - b).abs().max() <= 0.05 * a.abs().max()
    # The same chunks encoded independently (no history) do differ: the carry is what makes the edges seamless.
    if fmt != PCM:
        naive = b"".join(encode(x[i : i + 1920], fmt, MODEL_OUT) for i in range(0, len(x), 1920))
        assert int((decode(naive, fmt) != a).sum()) > 100


@pytest.mark.parametrize("rate", [16000, 22050, 48000])
@pytest.mark.parametrize("fmt", [PCM, PCMU], ids=["pcm", "pcmu"])
def test_chunked_output_equals_whole_at_other_model_rates(fmt: AudioFormat, rate: int) -> None:
    """A model speaking at another rate: the encoder resamples in whole blocks (16k -> 24k: 2 in, 3 out;
    22.05k -> 8k: 441 in, 160 out), and chunked still equals whole."""
    x = speech_like(1.0, rate, seed=5) * 2
    whole = encode(x, fmt, rate)
    assert len(whole) == fmt.bytes_per_sample * -(-len(x) * fmt.rate // rate)
    chunked = _chunked(fmt, x, [1, 7, 13, 480, 1920, 3, 2000, 121], rate)
    assert len(chunked) == len(whole)
    a, b = decode(whole, fmt), decode(chunked, fmt)
    assert int((a != b).sum()) <= len(a) // 1000


def test_output_encoder_is_reusable_after_flush() -> None:
    x = speech_like(0.3, 24000, seed=1)
    enc = OutputEncoder(PCMU, MODEL_OUT)
    first = enc.push(x) + enc.flush()
    assert first == enc.push(x[:1000]) + enc.push(x[1000:]) + enc.flush() == encode(x, PCMU, MODEL_OUT)


def test_time_stretch_keeps_the_pitch_and_ignores_chunking():
    sr = 24000
    t = np.arange(2 * sr) / sr
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    for speed in (0.5, 0.8, 1.25, 1.5):
        outs = []
        for chunk in (1920, 777, len(tone)):
            ts = TimeStretch(speed, MODEL_OUT)
            outs.append(np.concatenate([ts.push(tone[i : i + chunk]) for i in range(0, len(tone), chunk)]
                                       + [ts.flush()]))
        y = outs[0]
        assert all(np.array_equal(y, o) for o in outs[1:])  # the same samples however the input was cut
        assert len(y) == round(len(tone) / speed)
        mid = y[2000:-2000]
        pitch = np.fft.rfftfreq(len(mid), 1 / sr)[np.argmax(np.abs(np.fft.rfft(mid)))]
        assert abs(pitch - 220) < 2, (speed, pitch)  # resampling would give 220 * speed
        envelope = [np.sqrt(np.mean(mid[i : i + 480] ** 2)) for i in range(0, len(mid) - 480, 480)]
        assert min(envelope) > 0.2 and max(envelope) < 0.22  # no dropouts or bumps at the frame joins
    ts = TimeStretch(1.5, MODEL_OUT)
    assert len(np.concatenate([ts.push(np.full(100, 0.1, np.float32)), ts.flush()])) == 67
