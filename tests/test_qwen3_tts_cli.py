"""`omni-realtime generate` with the tiny Qwen3-TTS preset: text read aloud with a voice, a language and a
speaking style (greedy equals the pipeline's greedy turn), and the speaking flags checked against what the
model declares before anything loads (one line, exit code 2). The reading aloud runs the real entry point,
`python -m realtime.cli`, in a fresh process; the flag checks run the CLI's own `main` in this process
(tests/cli_run.py: the same exit code, stdout and stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from models import registry
from pipelines.types import AudioChunk, GenerationOptions, Message, Turn, TurnDone
from realtime.wav import read_wav
from tests.cli_run import Ran, run_cli

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Good morning! The train to Lyon leaves at nine."


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "realtime.cli", "generate", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_generate_reads_the_text_aloud_as_the_pipeline_does(tmp_path):
    out = tmp_path / "speech.wav"
    r = generate("--model", "tiny-tts", "--text", TEXT, "--voice", "SERENA", "--language", "english",
                 "--instructions", "Cheerful and fast.", "--greedy", "--device", "cpu", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    codes = result["codes"]
    assert result["text"] == TEXT and codes and all(len(c) == 16 for c in codes)
    assert len(codes) <= 50  # tiny-tts: at most 4 s of speech
    wave, rate = read_wav(str(out))
    assert rate == 24000 and wave.shape == (len(codes) * 1920,)
    opts = GenerationOptions(greedy=True, voice="serena", language="English", instructions="Cheerful and fast.")
    with registry.build_pipeline("tiny-tts") as pipeline:
        events = pipeline.run(Turn("cli", [Message("user", TEXT)], opts), timeout_s=300)
    done = events[-1]
    assert isinstance(done, TurnDone) and [list(c) for c in done.codes] == codes
    pcm = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
    # the tiny random decoder's output clips at +-1: its large gain turns float32 rounding differences between
    # two processes (thread counts) into ~2e-3
    np.testing.assert_allclose(wave, pcm, atol=5e-3)


def one_line_error(r: subprocess.CompletedProcess | Ran, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(w in lines[0] for w in words), lines


def test_speaking_flags_are_checked_before_loading(tmp_path):
    def check(*args: str) -> Ran:
        return run_cli("generate", "--text", "hi", *args)

    one_line_error(check("--model", "tiny-tts", "--language", "klingon"), "--language klingon", "english")
    one_line_error(check("--model", "tiny-tts", "--voice", "nobody"), "--voice nobody", "vivian")
    one_line_error(check("--model", "tiny-tts", "--reference-text", "hello"), "--reference-text")
    ref = tmp_path / "ref.wav"
    ref.write_bytes(b"")
    one_line_error(check("--model", "tiny-tts", "--reference-audio", str(ref)), "--reference-audio", "cannot clone")
    for blank in ("", " \t "):
        one_line_error(check("--model", "tiny-tts", "--reference-audio", str(ref), "--reference-text", blank),
                       "--reference-text is blank")
    one_line_error(check("--model", "tiny", "--language", "english"), "--language", "none")
