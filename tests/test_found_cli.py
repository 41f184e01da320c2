"""`omni-realtime` as a newcomer ran it (issue 14, items 6 and 7): each mistake is one line on stderr that names
its flag with a hint, exit code 2, before the model loads; audio files of any PCM width, FLAC and OGG are read;
`--host 0.0.0.0` prints a demo URL that answers.

Most cases run the CLI's own `main` in this process (tests/cli_run.py: the same exit code, stdout and stderr);
the real entry point, `python -m realtime.cli` in a fresh process, is run for a mistake, for a file read and
answered, and for the wildcard bind."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tests.cli_run import Ran
from tests.cli_run import run_cli as run
from tests.serve_process import serve

CLI = [sys.executable, "-m", "realtime.cli"]
ROOT = Path(__file__).resolve().parents[1]
LOADED = "loaded tiny"  # the model's load log line


def run_process(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def one_line_error(r: subprocess.CompletedProcess | Ran, command: str, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr and LOADED not in r.stderr, r.stderr
    assert lines[0].startswith(f"omni-realtime {command}: error: "), lines
    assert all(w in lines[0] for w in words), lines
    return lines[0]


def tone(path: Path, seconds: float = 0.5, rate: int = 16000, **kw) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(str(path), 0.3 * np.sin(2 * np.pi * 220 * t), rate, **kw)
    return path


GEN = ("generate", "--no-audio", "--max-text-tokens", "2")


def test_out_into_a_missing_folder_fails_before_generating(tmp_path: Path):
    one_line_error(run(*GEN, "--text", "hi", "--out", str(tmp_path / "no" / "a.wav")), "generate",
                   "--out", str(tmp_path / "no"), "does not exist", "create it first")
    one_line_error(run(*GEN, "--text", "hi", "--out", str(tmp_path)), "generate", "--out", "is a folder")


def test_an_empty_wav_is_named(tmp_path: Path):
    empty = tmp_path / "empty.wav"
    soundfile.write(str(empty), np.zeros(0), 16000, subtype="PCM_16")
    one_line_error(run(*GEN, "--audio", str(empty)), "generate", f"--audio {empty}", "no audio samples")


@pytest.mark.parametrize("name, kw", [
    ("a24.wav", {"subtype": "PCM_24"}), ("a32.wav", {"subtype": "PCM_32"}), ("a8.wav", {"subtype": "PCM_U8"}),
    ("a.flac", {}), ("a.ogg", {"subtype": "VORBIS"}), ("stereo48k.wav", {"subtype": "PCM_24"}),
])
def test_audio_of_any_pcm_width_flac_and_ogg_is_answered(tmp_path: Path, name: str, kw: dict):
    path = tone(tmp_path / name, rate=48000 if "48k" in name else 16000, **kw)
    if "stereo" in name:
        mono, rate = soundfile.read(str(path))
        soundfile.write(str(path), np.stack([mono, -mono], axis=1), rate, subtype="PCM_24")
    runner = run_process if name == "a.flac" else run  # one of them through the real entry point
    r = runner(*GEN, "--audio", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert '"status": "length"' in r.stdout


def test_a_file_that_is_not_audio_gets_a_hint(tmp_path: Path):
    text = tmp_path / "notes.txt"
    text.write_text("not audio at all\n")
    one_line_error(run_process(*GEN, "--audio", str(text)), "generate", f"--audio {text}", "cannot read it as audio",
                   "convert it")


def test_a_missing_audio_file_names_its_flag(tmp_path: Path):
    one_line_error(run(*GEN, "--audio", str(tmp_path / "none.wav")), "generate", "--audio", "no such file")


def test_an_unknown_speaker_fails_before_the_model_loads():
    for flag in ("--voice", "--speaker"):  # --speaker is --voice's old name
        one_line_error(run("generate", "--text", "hi", flag, "bob"), "generate", "--voice bob", "ethan")


def test_generate_help_has_a_description():
    r = run("generate", "--help")
    assert r.returncode == 0 and "offline through the same streaming pipeline" in " ".join(r.stdout.split())


def test_a_cuda_device_without_cuda_is_one_line():
    import torch

    if torch.cuda.is_available():
        one_line_error(run("serve", "--device", "cuda:99"), "serve", "--device cuda:99", "CUDA devices")
    else:
        one_line_error(run("serve", "--device", "cuda"), "serve", "--device cuda", "no CUDA", "--device cpu")
    one_line_error(run("serve", "--device", "tpu0"), "serve", "--device tpu0", "not a torch device")


def test_a_port_out_of_range():
    one_line_error(run("serve", "--port", "80000"), "serve", "--port 80000", "0-65535")


def test_a_missing_api_key_file_names_its_flag(tmp_path: Path):
    one_line_error(run("serve", "--api-key-file", str(tmp_path / "key")), "serve", "--api-key-file",
                   "No such file")


@pytest.mark.parametrize("flag", ["--threads", "--max-sessions", "--max-session-minutes", "--gil-switch-ms",
                                  "--max-sessions-per-client"])
def test_a_non_positive_number_names_one_flag(flag: str):
    line = one_line_error(run("serve", flag, "0"), "serve", f"{flag} must be positive")
    assert line.count("--") == 1, line


@pytest.mark.parametrize("flag", ["--play-ahead-s", "--drain-seconds"])
def test_a_negative_number_names_one_flag(flag: str):
    line = one_line_error(run("serve", flag, "-1"), "serve", f"{flag} must be zero or more")
    assert line.count("--") == 1, line


def test_a_broken_config_says_config_json_once(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_omni_moe"}')
    line = one_line_error(run("serve", "--model", str(tmp_path)), "serve", "--model", "thinker_config")
    assert line.count("config.json") == 1, line
    (tmp_path / "config.json").write_text("[1, 2]")
    one_line_error(run("serve", "--model", str(tmp_path)), "serve", "not a JSON object")


def test_a_wildcard_bind_prints_a_demo_url_that_answers():
    with serve("--host", "0.0.0.0") as served:
        assert "0.0.0.0" not in served.url
        with urllib.request.urlopen(served.url, timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
