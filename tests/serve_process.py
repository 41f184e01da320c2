"""`omni-realtime serve` as a child process on a free port, its log lines collected as they come."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Served:
    url: str  # the demo URL from the startup line, e.g. http://127.0.0.1:40123/
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    def records(self) -> list[dict]:
        """The JSON log lines (with --log-json)."""
        return [json.loads(line) for line in list(self.lines) if line.startswith("{")]

    def wait_for(self, what, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [r for r in self.records() if what(r)]
            if found:
                return found[-1]
            time.sleep(0.05)
        raise AssertionError(f"no such log line within {timeout} s; log:\n" + "\n".join(self.lines))


@contextmanager
def serve(*args: str, timeout: float = 120) -> Iterator[Served]:
    """Start `serve --port 0 --log-json ARGS`, wait for its startup line, stop it (SIGTERM) at the end."""
    proc = subprocess.Popen([sys.executable, "-m", "realtime.cli", "serve", "--port", "0", "--log-json", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    served = Served("", proc)

    def read() -> None:
        for line in proc.stdout:
            served.lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        start = served.wait_for(lambda r: r.get("message") == "serving", timeout)
        served.url = start["demo"]
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        reader.join(10)
