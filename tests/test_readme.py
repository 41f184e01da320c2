"""The README's quick start, run verbatim (bash, from a folder laid out like the repository root) against
`omni-realtime serve` on the tiny model: it must end with a spoken answer in answer.wav."""

from __future__ import annotations

import os
import re
import subprocess
import wave
from pathlib import Path

from realtime.cli import TINY_REPLY_FRAMES
from tests.serve_process import ROOT, serve


def quick_start_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the quick start has exactly one bash block"
    return blocks[0]


def test_quick_start_runs_verbatim(tmp_path: Path):
    block = quick_start_block()
    assert "examples/question.wav" in block and "answer.wav" in block
    for name in (".venv", "examples"):  # the block's relative paths, without writing into the checkout
        (tmp_path / name).symlink_to(ROOT / name)
    with serve() as served:
        env = {**os.environ, "OMNI_REALTIME_URL": served.url.rstrip("/")}
        env.pop("OMNI_REALTIME_API_KEY", None)
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"(completed|incomplete): \d+\.\d s of speech in answer\.wav", last), r.stdout
    with wave.open(str(tmp_path / "answer.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        seconds = w.getnframes() / 24000
    assert 0 < seconds <= TINY_REPLY_FRAMES * 0.08, seconds
    assert last.split(": ")[1].startswith(f"{seconds:.1f} s")
