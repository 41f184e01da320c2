"""The reference Qwen3-TTS environment (.venv-qwen-tts, `make qwen-tts-env`) as one process for the test session:
tests/reference/run_jobs.py runs each reference script in it, as `python script ARGS` would, paying the
reference package's imports once. Used through conftest's `qwen_tts_env` fixture."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_PY = ROOT / ".venv-qwen-tts" / "bin" / "python"


class QwenTTSEnv:
    def __init__(self, logs: Path | None = None) -> None:
        """Starts the process (it imports the reference package at once); `logs`, where each job's output goes,
        may be set later, before the first `run`."""
        assert REFERENCE_PY.is_file(), "the reference environment is missing: run `make qwen-tts-env`"
        self.logs, self.jobs = logs, 0
        # one torch thread, as in the tests (conftest): a pool of two on 2 shared cores takes 3x as long whenever
        # anything else runs beside it
        self.proc = subprocess.Popen([str(REFERENCE_PY), str(ROOT / "tests" / "reference" / "run_jobs.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.replies: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("done "):
                self.replies.put(line)
        self.replies.put("exited")

    def run(self, script: Path, *args: str, timeout: float = 900) -> None:
        """Run the reference script with ARGS; fail with the tail of its output unless it ends well in time."""
        assert self.logs is not None, "set QwenTTSEnv.logs before the first run"
        self.jobs += 1
        log = self.logs / f"job{self.jobs}.log"
        self.proc.stdin.write(json.dumps([str(log), str(script), *args]) + "\n")
        self.proc.stdin.flush()
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{script.name} still running after {timeout} s") from None
        output = log.read_text() if log.exists() else ""
        assert reply == "done 0\n", f"{script.name}: {reply.strip()}\n{output[-4000:]}"

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
