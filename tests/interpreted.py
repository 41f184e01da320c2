"""Runs a script under Triton's interpreter in a child process (TRITON_INTERPRET must be set before triton is first
imported, and another test module may already have imported it here) and returns the JSON its last line prints."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(script: str, timeout: float = 300) -> object:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


H200_PRELUDE = '''
import time, triton
from triton.backends.compiler import GPUTarget

target = GPUTarget("cuda", 90, 32)  # an H200; compiling needs no GPU, only the bundled ptxas
backend = triton.compiler.make_backend(target)


def compile_timed(label, fn, signature, constexprs, options):
    """Compile fn for sm_90; print the label, the seconds it took and the PTX's length."""
    src = triton.compiler.ASTSource(fn=fn, signature=signature | dict.fromkeys(constexprs, "constexpr"),
                                    constexprs=constexprs)
    start = time.perf_counter()
    ptx = triton.compile(src, target=target, options=backend.parse_options(options).__dict__).asm["ptx"]
    print(label, round(time.perf_counter() - start, 1), len(ptx), flush=True)
'''


def compiled_for_h200(script: str, timeout: float = 120) -> list[list[str]]:
    """Runs H200_PRELUDE + script (compile_timed calls) with the installed Triton compiling, not interpreting;
    returns the printed lines, split. Skips where Triton has no NVIDIA backend; a run past `timeout` fails."""
    import pytest

    if not (Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia").is_dir():
        pytest.skip("triton has no NVIDIA backend here")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run([sys.executable, "-c", H200_PRELUDE + script], capture_output=True, text=True,
                              cwd=ROOT, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"compiling for sm_90 took over {timeout} s: {e.stdout}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [line.split() for line in proc.stdout.strip().splitlines()]
