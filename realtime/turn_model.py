"""Install-time fetch of the Smart Turn v3.2 model: `python -m realtime.turn_model fetch [DEST]` (README "Turn
detection": from the pipecat-ai wheel, never installed, checked against a pinned SHA-256; idempotent)."""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .smart_turn import MODEL_NAME, turn_model_path

WHEEL = "pipecat-ai==1.14.0"
MEMBER = f"pipecat/audio/turn/smart_turn/data/{MODEL_NAME}"
SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(dest: Path) -> Path:
    if dest.is_file() and _sha256(dest.read_bytes()) == SHA256:
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp, WHEEL]
        subprocess.run(cmd, check=True)
        wheels = list(Path(tmp).glob("pipecat_ai-*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one pipecat-ai wheel from pip download, got {wheels}")
        with zipfile.ZipFile(wheels[0]) as z:
            data = z.read(MEMBER)
    if _sha256(data) != SHA256:
        raise RuntimeError(f"{MEMBER} from {WHEEL} has SHA-256 {_sha256(data)}, expected {SHA256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    part.write_bytes(data)
    part.replace(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realtime.turn_model")
    parser.add_argument("command", choices=["fetch"])
    parser.add_argument("dest", nargs="?", type=Path, default=None, help=f"default: {turn_model_path()}")
    args = parser.parse_args(argv)
    print(fetch(args.dest or turn_model_path()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
