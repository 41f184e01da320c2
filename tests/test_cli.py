"""`omni-realtime` as a user runs it: mistakes are one line on stderr with exit code 2, no traceback.

Most mistakes run the CLI's own `main` in this process (tests/cli_run.py: the same exit code, stdout and
stderr); a port in use and --debug's traceback run the real entry point, `python -m realtime.cli`, in a fresh
process."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from realtime.cli import parser
from tests.cli_run import Ran
from tests.cli_run import run_cli as run

CLI = [sys.executable, "-m", "realtime.cli"]
ROOT = Path(__file__).resolve().parents[1]


def run_process(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def one_line_error(r: subprocess.CompletedProcess | Ran, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("omni-realtime serve: error: "), lines
    assert all(w in lines[0] for w in words), lines
    return lines[0]


def test_wrong_model_path(tmp_path: Path):
    one_line_error(run("serve", "--model", str(tmp_path / "nowhere")), "nowhere", "no such directory")
    one_line_error(run("serve", "--model", str(tmp_path)), "no config.json")


def test_broken_config_names_the_file(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_omni_moe",')
    one_line_error(run("serve", "--model", str(tmp_path)), str(tmp_path / "config.json"), "not valid JSON")


def test_unsupported_model_type(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    one_line_error(run("serve", "--model", str(tmp_path)), "model_type 'llama' is not supported")


def test_port_in_use_fails_before_the_model_loads():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        r = run_process("serve", "--port", str(port))
        elapsed = time.monotonic() - t0
    one_line_error(r, f"127.0.0.1:{port}", "Address already in use", "--port")
    assert "loaded tiny" not in r.stderr and elapsed < 30, (elapsed, r.stderr)


def test_debug_shows_the_traceback(tmp_path: Path):
    r = run_process("serve", "--model", str(tmp_path / "nowhere"), "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and "UsageError" in r.stderr, r.stderr


def test_tls_key_without_certificate(tmp_path: Path):
    one_line_error(run("serve", "--ssl-keyfile", str(tmp_path / "k.pem")), "--ssl-keyfile needs --ssl-certfile")
    one_line_error(run("serve", "--ssl-certfile", str(tmp_path / "c.pem")), "cannot load the TLS certificate")


def test_version():
    from importlib.metadata import version

    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"omni-realtime {version('omni-realtime')}", r


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_help_states_every_default(command: str):
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    text = " ".join(sub.format_help().split())
    for action in sub._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        helped = " ".join(sub._get_formatter()._expand_help(action).split())
        assert "default" in helped and helped in text, (action.option_strings, helped)
    if command == "serve":
        assert "--model tiny a reply stops after" in text  # the tiny model's reply cap is stated


def test_help_never_shows_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OMNI_REALTIME_API_KEY", "sekrit-from-env")  # main builds its parser after this
    r = run("serve", "--help")
    assert r.returncode == 0 and "sekrit-from-env" not in r.stdout and "OMNI_REALTIME_API_KEY" in r.stdout


def test_torch_threads_default_to_one_on_cuda_and_up_to_four_on_cpu(monkeypatch: pytest.MonkeyPatch):
    """On CUDA the CPU runs only small audio ops, which more threads made slower (benchmarks/RESULTS.md, 2026-12-02
    seventh session); on CPU the model itself runs on them. An explicit --threads wins."""
    from realtime.cli_checks import default_threads

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert (default_threads("cuda"), default_threads("cuda:1"), default_threads("cpu")) == (1, 1, 4)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert default_threads("cpu") == 2
    assert parser().parse_args(["serve"]).threads is None  # resolved by serve once the device is known
    assert parser().parse_args(["serve", "--threads", "3"]).threads == 3


def test_no_triton_reaches_the_kernels_switches_and_the_next_build_puts_them_back():
    from models.common import fp8_moe, fused, skinny
    from pipelines import sampling
    from tests.cli_run import run_cli

    def switches() -> tuple[bool, ...]:
        return not fused.OFF, skinny.ENABLED, sampling.FUSED, fp8_moe.DISPATCH

    try:
        ran = run_cli("generate", "--text", "hi", "--no-triton", "--max-text-tokens", "2", "--max-frames", "2")
        assert ran.returncode == 0, ran.stderr
        assert switches() == (False,) * 4
        ran = run_cli("generate", "--text", "hi", "--max-text-tokens", "2", "--max-frames", "2")
        assert ran.returncode == 0, ran.stderr
        assert switches() == (True,) * 4
    finally:
        fused.use_triton(True)
