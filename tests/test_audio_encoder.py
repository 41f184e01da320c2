"""Audio encoder parity with transformers' `get_audio_features` on both tiny variants (float32, CPU)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from models.qwen3_omni.audio_encoder import AudioEncoder
from models.qwen3_omni.audio_features import audio_token_count
from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.model import load_weights

REL_TOL = 1e-5  # max|ours - ref| <= REL_TOL * max|ref|; measured about 5e-7


@pytest.fixture(scope="module")
def encoder(hf_tiny) -> AudioEncoder:
    cfg = OmniConfig.from_file(hf_tiny.path).thinker.audio
    with torch.device("meta"):
        enc = AudioEncoder(cfg)
    load_weights(enc, hf_tiny.path, prefix="thinker.audio_tower.")
    return enc.eval()


def reference(hf_tiny, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_tiny.model.thinker.get_audio_features(features, mask).last_hidden_state


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    err, scale = (ours - ref).abs().max().item(), ref.abs().max().item()
    assert err <= REL_TOL * scale, f"max abs err {err:.3e}, max |ref| {scale:.3e}"


def test_token_count() -> None:
    assert [audio_token_count(n) for n in (100, 200, 370)] == [13, 26, 48]
    frames = torch.arange(0, 2500)
    assert torch.equal(audio_token_count(frames), _get_feat_extract_output_lengths(frames))


@pytest.mark.parametrize("frames", [1, 37, 100, 250, 1003])
def test_single_audio_matches_reference(hf_tiny, encoder: AudioEncoder, frames: int) -> None:
    features = torch.randn(1, 128, frames, generator=torch.Generator().manual_seed(frames))
    ref = reference(hf_tiny, features, torch.ones(1, frames, dtype=torch.long))
    with torch.no_grad():
        ours = encoder(features[0])
    assert ours.shape[0] == audio_token_count(frames)
    assert_close(ours, ref)


@pytest.mark.parametrize("lengths", [(1003, 37), (180, 250)])
def test_padded_batch_matches_reference(hf_tiny, encoder: AudioEncoder, lengths: tuple[int, int]) -> None:
    longest = max(lengths)
    features = torch.randn(2, 128, longest, generator=torch.Generator().manual_seed(7))
    mask = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).long()
    features = features * mask[:, None, :]  # what the feature extractor's padding holds
    ref = reference(hf_tiny, features, mask)
    with torch.no_grad():
        batched = encoder(features, mask.sum(1))
        per_audio = encoder.encode([f[:, :n] for f, n in zip(features, lengths, strict=True)])
    assert_close(batched, ref)
    assert [p.shape[0] for p in per_audio] == [audio_token_count(n) for n in lengths]
    assert torch.equal(torch.cat(per_audio), batched)
