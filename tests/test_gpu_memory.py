"""`--gpu-memory-gib` off CUDA: refused in one line before the model loads (the cap itself needs a GPU: the lead's
bench_load run with `--gpu-memory-gib` is its check)."""

from __future__ import annotations

import pytest

from models import registry
from tests.cli_run import run_cli


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["generate", "--text", "Hi."]])
def test_the_cap_is_refused_on_cpu_in_one_line(command):
    r = run_cli(*command, "--device", "cpu", "--gpu-memory-gib", "8")  # the CLI's own main, in this process
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--gpu-memory-gib" in lines[0] and "cpu" in lines[0] and "loaded" not in r.stderr, lines


def test_the_library_refuses_it_on_cpu_too():
    with pytest.raises(ValueError, match="caps CUDA memory"):
        registry.build_pipeline("tiny", "cpu", gpu_memory_gib=8)
