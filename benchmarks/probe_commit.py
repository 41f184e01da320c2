"""`bench_load.py` with the steps of each commit timed, and the CUDA graphs' capture time.

For every `input_audio_buffer.commit` the server receives, one line on stderr:

    commit_steps {"arrive": 0.0, "enc0": 0.11, "enc1": 1.23, "take0": 1.3, "seal0": 1.86, "seal1": 3.68, ...}

milliseconds after the commit arrived: `enc0`/`enc1` the last batch the audio worker resampled and encoded
(`InputStream.encode`; before 0 when it ran before the commit), `take0`/`take1` the commit's own job
(`InputStream.take`: the rest, the tail, then `seal0`/`seal1` the encoder's host work, `AudioStream.seal`), `done` the
commit handled (its item made and `input_audio_buffer.committed` sent). Then `capture_s` once the graphs are
captured. `--buckets 32,128,512` sets the prefill token buckets (`PrefillGraphs.TOKENS`) for an A/B. Every other
flag is bench_load's:

    python benchmarks/probe_commit.py --sessions 1,1,1 --quantization fp8 [--buckets 32,128,512]

The timing wraps the classes' methods in this process (the server runs in bench_load's process).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.qwen3_omni.audio_stream import AudioStream  # noqa: E402
from pipelines.graphs import PrefillGraphs  # noqa: E402
from pipelines.program import StagedProgram  # noqa: E402
from realtime import session  # noqa: E402
from realtime.audio import InputStream  # noqa: E402

marks: dict[str, float] = {}  # the current commit's steps (one session at a time gives clean lines)


def _timed(fn: Callable[..., Any], start: str, end: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        marks[start] = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            marks[end] = time.perf_counter()

    return run


def _commit(handler: Callable[..., Any]) -> Callable[..., Any]:
    async def commit(self: session.RealtimeSession, event: dict) -> None:
        marks.clear()
        marks["arrive"] = time.perf_counter()
        await handler(self, event)
        marks["done"] = time.perf_counter()
        t0 = marks["arrive"]
        steps = {k: round((t - t0) * 1e3, 2) for k, t in sorted(marks.items(), key=lambda kv: kv[1])}
        print("commit_steps", json.dumps(steps), file=sys.stderr, flush=True)

    return commit


def _capture(capture: Callable[[StagedProgram], float]) -> Callable[[StagedProgram], float]:
    def run(program: StagedProgram) -> float:
        seconds = capture(program)
        print("capture_s", round(seconds, 2), file=sys.stderr, flush=True)
        return seconds

    return run


def instrument() -> None:
    InputStream.encode = _timed(InputStream.encode, "enc0", "enc1")
    InputStream.take = _timed(InputStream.take, "take0", "take1")
    AudioStream.seal = _timed(AudioStream.seal, "seal0", "seal1")
    session.HANDLERS["input_audio_buffer.commit"] = _commit(session.HANDLERS["input_audio_buffer.commit"])
    StagedProgram.capture = _capture(StagedProgram.capture)


def main(argv: list[str] | None = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--buckets" in argv:
        i = argv.index("--buckets")
        try:
            PrefillGraphs.TOKENS = tuple(sorted(int(x) for x in argv[i + 1].split(",")))
        except (IndexError, ValueError):
            sys.exit("probe_commit.py: error: --buckets needs comma-separated token counts, like 32,128,512")
        del argv[i : i + 2]
    instrument()
    from benchmarks import bench_load  # after: its record of the seal policy compares with the class's

    return bench_load.main(argv)


if __name__ == "__main__":
    main()
