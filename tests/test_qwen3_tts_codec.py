"""Qwen3-TTS's 12 Hz speech tokenizer against the reference (qwen-tts 0.1.1), and streamed against one-shot.

tests/reference/qwen_tts_codec.py builds a tiny random tokenizer with the reference's own classes, saves it
as a checkpoint's speech_tokenizer/ folder, and records its decode of 40 random frames and its encode of
a 0.5 s waveform; we load that folder with our loader and must match: the waveform to 1e-5 in float32,
the codes exactly. Code2WavSlots streams of it (eager pushes of any size, batched steps across streams)
must equal our one-shot decode before the clamp to [-1, 1] (random weights make loud output, and the clamp
would hide errors): to 1e-9 in float64, 1e-5 in float32, relative to the peak.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.common.code2wav_batch import Code2WavSlots
from models.qwen3_tts.speech_tokenizer import SpeechTokenizer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory, qwen_tts_env) -> tuple[SpeechTokenizer, dict[str, torch.Tensor]]:
    out = tmp_path_factory.mktemp("qwen_tts_codec")
    qwen_tts_env.run(ROOT / "tests" / "reference" / "qwen_tts_codec.py", str(out), timeout=600)
    return SpeechTokenizer.load(out / "speech_tokenizer"), load_file(str(out / "reference.safetensors"))


def test_decode_matches_reference(ref: tuple[SpeechTokenizer, dict[str, torch.Tensor]]) -> None:
    tok, r = ref
    ours = tok.decode(r["codes"])
    assert ours.shape == r["wave"].shape == (r["codes"].shape[0] * 1920,)
    assert 0.05 < r["wave"].abs().max() < 0.99  # a real signal, not silence, and not clamped (which hides errors)
    err = (ours - r["wave"]).abs().max().item()
    print(f"decode max abs error vs reference: {err:.2e}")
    assert err < 1e-5


def test_encode_matches_reference(ref: tuple[SpeechTokenizer, dict[str, torch.Tensor]]) -> None:
    tok, r = ref
    codes = tok.encode(r["audio"], 24000)
    assert codes.shape == r["audio_codes"].shape == (7, 16)
    assert len(codes.unique()) > 8  # the random codebooks do not collapse to one code
    assert torch.equal(codes, r["audio_codes"].long())


def test_encode_resamples_and_checks_input(ref: tuple[SpeechTokenizer, dict[str, torch.Tensor]]) -> None:
    tok, r = ref
    at_16k = torch.sin(2 * torch.pi * 220 * torch.arange(8000) / 16000)
    assert tok.encode(at_16k, 16000).shape == (7, 16)  # 0.5 s -> 12000 samples at 24 kHz -> 7 frames
    with pytest.raises(ValueError, match="mono"):
        tok.encode(torch.zeros(2, 100), 24000)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
def test_streamed_equals_one_shot(ref: tuple[SpeechTokenizer, dict[str, torch.Tensor]], dtype: torch.dtype,
                                  tol: float) -> None:
    tok, r = ref
    model = tok.decoder.to(dtype)
    try:
        codes = r["codes"].T[None]  # [1, Q, F]
        streams = [codes[..., :n] for n in (40, 1, 2, 13)]
        whole = [model.decode(s, clamp=False)[0, 0] for s in streams]
        dec = Code2WavSlots(model, 3, "cpu", dtype, clamp=False)
        # stream 0 eagerly in uneven pieces; streams 1..3 one frame per batched step (first frames together)
        slot = dec.open()
        pieces = [dec.push(slot, codes[..., a:b]) for a, b in ((0, 1), (1, 4), (4, 5), (5, 23), (23, 40))]
        dec.close(slot)
        got = [torch.cat(pieces, dim=-1)[0]]
        slots = [dec.open() for _ in streams[1:]]
        outs: list[list[torch.Tensor]] = [[] for _ in slots]
        for f in range(13):
            rows = [i for i, s in enumerate(streams[1:]) if s.shape[-1] > f]
            idx = torch.tensor([slots[i] for i in rows] + [dec.scratch])  # one padding row
            frame = torch.stack([streams[1 + i][0, :, f] for i in rows] + [streams[1][0, :, 0]])
            pcm = dec.step(idx, frame, first=f == 0)
            for j, i in enumerate(rows):
                outs[i].append(pcm[j])
        got += [torch.cat(o) for o in outs]
        for g, w in zip(got, whole, strict=True):
            assert g.shape == w.shape
            assert (g - w).abs().max().item() < tol * w.abs().max().clamp(min=1).item()
    finally:
        tok.decoder.float()
