
import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.models.qwen3_omni_moe import processing_qwen3_omni_moe
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from models.qwen3_omni.audio_features import audio_token_count, log_mel, mel_filterbank

FEATURE_ATOL = 1e-4
SR = 16000
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
def test_log_mel_on_cuda(reference: WhisperFeatureExtractor) -> None:
    for waves in CASES.values():
        waves = [w.astype(np.float32) for w in waves]
        ref_feat, ref_mask = reference_features(reference, waves)
        feat, mask = log_mel([torch.from_numpy(w).cuda() for w in waves])
        assert (feat.cpu() - ref_feat).abs().max().item() <= FEATURE_ATOL
        assert torch.equal(mask.cpu(), ref_mask)


def test_audio_token_count_matches_reference() -> None:
    frames = torch.arange(0, 6001)
    assert torch.equal(audio_token_count(frames), _get_feat_extract_output_lengths(frames))
    assert [audio_token_count(n) for n in (100, 200, 370)] == [13, 26, 48]
    assert all(audio_token_count(int(n)) == int(_get_feat_extract_output_lengths(n)) for n in frames[:400])
