"""Greedy end to end through our streaming pipeline == transformers' Qwen3-Omni generate, on the same
checkpoint, audio and prompt: text ids, codec codes and waveform. Also through the CLI, and for a
second turn that reuses the cached KV of the first."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models.common import chat
from models.common.tokenizer import Tokenizer
from models.qwen3_omni.audio_features import audio_token_count, log_mel
from models.qwen3_omni.placement import PipelineConfig
from models.qwen3_omni.program import build_pipeline
from pipelines.types import AudioChunk, GenerationOptions, Message, Turn, TurnDone
from realtime.wav import read_wav, write_wav
from tests.cli_run import run_cli

TEXT_TOKENS, FRAMES = 6, 5
SYSTEM = "You are a helpful voice assistant."


def speech_like(seconds: float, seed: int) -> torch.Tensor:
    """An int16-representable test waveform (a few gliding harmonics under noise)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * 16000)) / 16000
    f0 = 140 + 40 * torch.sin(2 * torch.pi * 1.5 * t)
    phase = 2 * torch.pi * torch.cumsum(f0, 0) / 16000
    x = sum(torch.sin(k * phase) / k for k in range(1, 5)) * 0.2 + 0.02 * torch.randn(t.shape, generator=g)
    return (x * 32767).round().clamp(-32768, 32767) / 32768


def reference(hf, ids: list[int], audios: list[torch.Tensor], frames: int = FRAMES) -> dict:
    """transformers' generate, greedy, with our prompt ids and each audio's own log-mel features."""
    singles = [log_mel([a])[0][0] for a in audios]  # as the pipeline computes them: one audio at a time
    width = max(f.shape[1] for f in singles)
    feats = torch.stack([torch.nn.functional.pad(f, (0, width - f.shape[1])) for f in singles])
    mask = torch.stack([(torch.arange(width) < f.shape[1]).long() for f in singles])
    captured = {}
    decode = hf.code2wav.chunked_decode

    def spy(codes, **kw):
        captured["codes"] = codes.clone()
        return decode(codes, **kw)

    hf.code2wav.chunked_decode = spy
    hook = hf.code2wav.decoder[-1].register_forward_hook(lambda m, i, out: captured.setdefault("raw", out))
    try:
        with torch.no_grad():
            seq, wav = hf.generate(
                input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                input_features=feats, feature_attention_mask=mask, speaker="ethan", return_audio=True,
                thinker_max_new_tokens=TEXT_TOKENS, thinker_do_sample=False,
                talker_do_sample=False, talker_max_new_tokens=frames + 1,
            )
    finally:
        hf.code2wav.chunked_decode = decode
        hook.remove()
    return {
        "raw_peak": float(captured["raw"].abs().max()),
        "text_ids": seq[0, len(ids) :].tolist(),
        "codes": captured["codes"][0].T.tolist(),
        "wav": wav.reshape(-1).float().numpy(),
    }


def prompt_ids(tok: Tokenizer, audio: torch.Tensor, text: str) -> list[int]:
    n = int(audio_token_count(int(log_mel([audio])[1].sum())))
    return list(chat.render(tok, [chat.Turn("system", SYSTEM), chat.Turn("user", text, n)]).ids)


def ours(pipeline, session: str, audio: torch.Tensor, text: str, system: bool = True) -> tuple[TurnDone, list]:
    msgs = ([Message("system", SYSTEM)] if system else []) + [Message("user", text, audio)]
    opts = GenerationOptions(greedy=True, max_text_tokens=TEXT_TOKENS, max_frames=FRAMES)
    events = pipeline.run(Turn(session, msgs, opts), timeout_s=300)
    return events[-1], events


def assert_same(done: TurnDone, wav: np.ndarray, ref: dict) -> None:
    assert list(done.text_ids) == ref["text_ids"]
    assert [list(c) for c in done.codes] == ref["codes"]
    assert wav.shape == ref["wav"].shape
    # Random tiny weights drive the pre-clamp waveform to peaks of ~100, so float32 rounding shows at
    # ~1e-3 absolute; the tolerance is relative to that peak, as in the Code2Wav parity tests.
    np.testing.assert_allclose(wav, ref["wav"], atol=1e-4 * max(1.0, ref["raw_peak"]), rtol=0)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.builtin()


def test_python_api_matches_generate(hf_tiny, tokenizer):
    audio = speech_like(1.7, seed=1)
    ref = reference(hf_tiny.model, prompt_ids(tokenizer, audio, "Hi!"), [audio])
    with build_pipeline(PipelineConfig(model=str(hf_tiny.path))) as p:
        done, events = ours(p, "s", audio, "Hi!")
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert_same(done, np.concatenate([c.pcm for c in chunks]), ref)
    # streamed: one chunk per frame, the first right after the first frame (1920 - 555 final samples)
    assert [c.frames for c in chunks] == list(range(1, FRAMES + 1))
    assert [len(c.pcm) for c in chunks] == [1920 - 555] + [1920] * (FRAMES - 1)
    assert done.status == "length" and done.usage.audio_frames == FRAMES and done.timings["first_audio_ms"] > 0


def test_cli_matches_generate(hf_tiny_a, tokenizer, tmp_path):
    audio = speech_like(1.2, seed=2)
    write_wav(tmp_path / "in.wav", audio.numpy(), rate=16000)
    ref = reference(hf_tiny_a.model, prompt_ids(tokenizer, audio, ""), [audio])
    # the CLI's own main, in this process (test_cli.py and test_found_cli.py run the entry point in fresh ones)
    out = run_cli("generate", "--model", str(hf_tiny_a.path), "--device", "cpu", "--audio", str(tmp_path / "in.wav"),
                  "--system", SYSTEM, "--greedy", "--max-text-tokens", str(TEXT_TOKENS), "--max-frames", str(FRAMES),
                  "--out", str(tmp_path / "out.wav"), "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["text_ids"] == ref["text_ids"] and result["codes"] == ref["codes"]
    wav, rate = read_wav(tmp_path / "out.wav")
    assert rate == 24000 and result["audio_seconds"] == pytest.approx(len(ref["wav"]) / 24000)
    atol = 1.5 / 32768 + 1e-4 * max(1.0, ref["raw_peak"])  # 16-bit WAV, float32 rounding (see assert_same)
    np.testing.assert_allclose(wav.numpy(), ref["wav"], atol=atol)
    assert result["time_to_first_audio_ms"] > 0 and result["rtf"] > 0


def test_second_turn_on_cached_kv_matches_fresh_generate(hf_tiny_a, tokenizer):
    a1, a2 = speech_like(1.1, seed=3), speech_like(0.9, seed=4)
    with build_pipeline(PipelineConfig(model=str(hf_tiny_a.path))) as p:
        first, _ = ours(p, "s", a1, "")
        program = p.program
        p.sync()
        cached = program.by_name["thinker"].kv.length("thinker:s")
        done, events = ours(p, "s", a2, "and this?", system=False)
        conversation = list(program.sessions["s"].ids)
    assert done.usage.cached_tokens == len(prompt_ids(tokenizer, a1, "")) + TEXT_TOKENS
    assert cached == done.usage.cached_tokens - 1  # the first reply's last token was never fed
    full = conversation[: done.usage.input_tokens]  # both turns, as one fresh prompt for the reference
    ref = reference(hf_tiny_a.model, full, [a1, a2])
    assert_same(done, np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)]), ref)
