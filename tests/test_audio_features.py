import math
import warnings

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.models.qwen3_omni_moe import processing_qwen3_omni_moe
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from models.qwen3_omni.audio_features import (
    alaw_decode,
    alaw_encode,
    audio_token_count,
    float_to_g711,
    float_to_pcm16,
    g711_to_float,
    log_mel,
    mel_filterbank,
    pcm16_to_float,
    resample,
    ulaw_decode,
    ulaw_encode,
)

FEATURE_ATOL = 1e-4
SR = 16000
ALL_INT16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)
PROCESSOR_AUDIO_KWARGS = {"sampling_rate": SR, "padding": True, "truncation": False, "return_attention_mask": True}


@pytest.fixture(scope="module")
def reference() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(feature_size=128, sampling_rate=SR, hop_length=160, n_fft=400)


def reference_features(fe: WhisperFeatureExtractor, waves: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    out = fe(waves, **PROCESSOR_AUDIO_KWARGS, return_tensors="pt")
    return out["input_features"], out["attention_mask"]


def test_processor_calls_feature_extractor_with_these_kwargs() -> None:
    processor = processing_qwen3_omni_moe.Qwen3OmniMoeProcessor
    if hasattr(processor, "audio_kwargs"):
        defaults = processor.audio_kwargs
    else:
        defaults = processing_qwen3_omni_moe.Qwen3OmniMoeProcessorKwargs._defaults["audio_kwargs"]
    assert {key: defaults.get(key) for key in PROCESSOR_AUDIO_KWARGS} == PROCESSOR_AUDIO_KWARGS


def tone(freq: float, sr: int, n: int) -> np.ndarray:
    return np.sin(2 * np.pi * freq * np.arange(n) / sr)


def noise(n: int, seed: int, scale: float = 0.1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n) * scale


CASES = {
    "noise_1s": [noise(SR, 0)],
    "sine_plus_noise": [0.5 * tone(440.0, SR, 28_000) + noise(28_000, 1, 0.01)],
    "batch_0.3_1_2.37s": [noise(4800, 2), 0.3 * tone(1000.0, SR, SR), noise(37_920, 3, 0.5)],
    "batch_odd_lengths": [noise(37_921, 4), noise(4801, 5), noise(161, 6)],
    "short_100_in_batch": [noise(100, 7), noise(SR, 8)],
    "empty_in_batch": [np.zeros(0), noise(3000, 9)],
    "single_201": [noise(201, 10)],
    "silence": [np.zeros(SR)],
    "silence_in_batch": [np.zeros(8000), noise(SR, 11)],
    "loud_clipped": [np.clip(noise(SR, 12, 2.0), -1, 1)],
}


@pytest.mark.parametrize("name", list(CASES))
def test_log_mel_matches_whisper_feature_extractor(reference: WhisperFeatureExtractor, name: str) -> None:
    waves = [w.astype(np.float32) for w in CASES[name]]
    ref_feat, ref_mask = reference_features(reference, waves)
    feat, mask = log_mel([torch.from_numpy(w) for w in waves])
    assert feat.shape == ref_feat.shape and feat.dtype == torch.float32
    assert (feat - ref_feat).abs().max().item() <= FEATURE_ATOL
    assert torch.equal(mask, ref_mask)


def test_frame_counts_and_mask_quirk(reference: WhisperFeatureExtractor) -> None:
    feat, mask = log_mel(torch.from_numpy(noise(SR, 0).astype(np.float32)))
    assert feat.shape == (1, 128, 100) and mask.sum().item() == 100
    alone = log_mel([torch.zeros(4801)])[1].sum().item()
    batched = log_mel([torch.zeros(4801), torch.zeros(SR)])[1][0].sum().item()
    assert (alone, batched) == (30, 31)
    assert reference_features(reference, [np.zeros(4801, np.float32), np.zeros(SR, np.float32)])[1][0].sum() == 31


def test_tensor_batch_equals_list() -> None:
    waves = torch.from_numpy(np.stack([noise(5000, 1), noise(5000, 2)]).astype(np.float32))
    feat, mask = log_mel(waves)
    list_feat, list_mask = log_mel(list(waves))
    assert torch.equal(feat, list_feat) and torch.equal(mask, list_mask)


def test_too_short_input_is_rejected_like_reference(reference: WhisperFeatureExtractor) -> None:
    with pytest.raises(ValueError):
        log_mel([torch.zeros(100)])
    with pytest.raises(RuntimeError):
        reference_features(reference, [np.zeros(100, np.float32)])


def test_mel_filterbank_matches_reference(reference: WhisperFeatureExtractor) -> None:
    assert np.abs(mel_filterbank() - reference.mel_filters).max() <= 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_log_mel_and_resample_on_cuda(reference: WhisperFeatureExtractor) -> None:
    for waves in CASES.values():
        waves = [w.astype(np.float32) for w in waves]
        ref_feat, ref_mask = reference_features(reference, waves)
        feat, mask = log_mel([torch.from_numpy(w).cuda() for w in waves])
        assert (feat.cpu() - ref_feat).abs().max().item() <= FEATURE_ATOL
        assert torch.equal(mask.cpu(), ref_mask)
    for sr_in in (8000, 24_000, 44_100, 48_000):
        x = torch.from_numpy(tone(1000.0, sr_in, 3 * sr_in) + noise(3 * sr_in, 0, 0.3)).float().reshape(3, -1)
        assert (resample(x.cuda(), sr_in).cpu() - resample(x, sr_in)).abs().max().item() <= 1e-5


def test_audio_token_count_matches_reference() -> None:
    frames = torch.arange(0, 6001)
    assert torch.equal(audio_token_count(frames), _get_feat_extract_output_lengths(frames))
    assert [audio_token_count(n) for n in (100, 200, 370)] == [13, 26, 48]
    assert all(audio_token_count(int(n)) == int(_get_feat_extract_output_lengths(n)) for n in frames[:400])


@pytest.mark.parametrize("sr_in", [8000, 24_000, 44_100, 48_000])
def test_resample_keeps_a_tone(sr_in: int) -> None:
    n = int(1.5 * sr_in)
    out = resample(torch.from_numpy(tone(1000.0, sr_in, n).astype(np.float32)), sr_in)
    assert out.shape == (math.ceil(n * SR / sr_in),) and out.dtype == torch.float32
    middle = slice(800, -800)
    err = (out.double() - torch.from_numpy(tone(1000.0, SR, len(out))))[middle].abs().max().item()
    assert err <= 1e-5


def rms_gain_db(freq: float, sr_in: int) -> float:
    out = resample(torch.from_numpy(tone(freq, sr_in, sr_in).astype(np.float32)), sr_in).double()[800:-800]
    return 20 * math.log10(out.pow(2).mean().sqrt().item() * math.sqrt(2) + 1e-12)


@pytest.mark.parametrize("sr_in", [24_000, 44_100, 48_000])
def test_resample_passband_and_aliasing(sr_in: int) -> None:
    assert all(abs(rms_gain_db(f, sr_in)) <= 0.1 for f in (100.0, 3000.0, 6800.0))
    assert all(rms_gain_db(f, sr_in) <= -70.0 for f in (8400.0, 9000.0, 11_000.0))


def test_resample_upsampling_has_no_images() -> None:
    out = resample(torch.from_numpy(tone(3000.0, 8000, 8000).astype(np.float32)), 8000).double()[800:-800]
    spectrum = torch.fft.rfft(out * torch.hann_window(len(out), dtype=torch.float64)).abs()
    freqs = torch.fft.rfftfreq(len(out), 1 / SR)
    assert 20 * torch.log10(spectrum[freqs > 4200].max() / spectrum.max()).item() <= -70.0


def test_resample_batched_lengths_and_identity() -> None:
    x = torch.randn(3, 2, 4410)
    out = resample(x, 44_100)
    assert out.shape == (3, 2, 1600)
    assert torch.allclose(out[1, 0], resample(x[1, 0], 44_100), atol=1e-6)
    assert resample(x, SR, SR) is x
    assert resample(torch.randn(7), 24_000).shape == (5,)


def test_pcm16_round_trip() -> None:
    data = ALL_INT16.numpy().astype("<i2").tobytes()
    samples = pcm16_to_float(data)
    assert samples.dtype == torch.float32 and samples.min() == -1.0 and samples.max() == 32767 / 32768
    assert float_to_pcm16(samples) == data
    assert float_to_pcm16(torch.tensor([2.0, -2.0])) == np.array([32767, -32768], "<i2").tobytes()


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
