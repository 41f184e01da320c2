"""/v1/audio/speech through the real server on loopback: first audio byte and underruns under Poisson arrivals.

Requests (stream_format "audio", pcm) arrive at --rate per second (exponential gaps) until --requests were
sent, each reading the bytes as they come:
- first byte: request sent -> first audio byte received (p50 / p95 / max);
- underruns: a player starts 100 ms after the first byte and plays 24 kHz in real time; a chunk that arrives
  after the audio so far has run out is one underrun (playback resumes with it);
- RTF: request sent -> last byte, over the seconds of audio received.

  python -m benchmarks.bench_speech --model tiny-tts --device cpu --rate 1 --requests 5   # smoke test
  python -m benchmarks.bench_speech --model DIR --load 1:20 --load 20:200 --load 0:64    # on a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.loopback import running

BYTES_PER_S = 24000 * 2
START_BUFFER_S = 0.1


@dataclass
class Stream:
    first_s: float = 0.0
    total_s: float = 0.0
    audio_s: float = 0.0
    underruns: int = 0
    error: str = ""


async def one(http: aiohttp.ClientSession, url: str, text: str) -> Stream:
    out, sent, got = Stream(), time.perf_counter(), 0
    body = {"model": "tts", "input": text, "voice": "alloy", "response_format": "pcm", "stream_format": "audio"}
    try:
        async with http.post(url + "/audio/speech", json=body) as r:
            if r.status != 200:
                out.error = f"HTTP {r.status}: {(await r.read())[:200]!r}"
                return out
            play_start = None
            async for chunk in r.content.iter_any():
                now = time.perf_counter()
                if play_start is None:
                    out.first_s, play_start = now - sent, now + START_BUFFER_S
                elif now > play_start + got / BYTES_PER_S:
                    out.underruns += 1
                    play_start = now - got / BYTES_PER_S  # playback resumes with this chunk
                got += len(chunk)
    except aiohttp.ClientError as e:
        out.error = repr(e)
    out.total_s, out.audio_s = time.perf_counter() - sent, got / BYTES_PER_S
    return out


async def load(url: str, rate: float, requests: int, chars: int, seed: int) -> list[Stream]:
    rng = random.Random(seed)
    text = ("The quick brown fox jumps over the lazy dog. " * (chars // 40 + 1))[:chars]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = []
        for _ in range(requests):
            tasks.append(asyncio.create_task(one(http, url, text)))
            if rate > 0:
                await asyncio.sleep(rng.expovariate(rate))
        return await asyncio.gather(*tasks)


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def report(streams: list[Stream], rate: float) -> dict:
    ok = [s for s in streams if not s.error]
    first = [s.first_s * 1000 for s in ok]
    return {
        "rate": rate, "requests": len(streams), "ok": len(ok), "errors": [s.error for s in streams if s.error][:5],
        "first_byte_ms": {"p50": round(statistics.median(first), 1) if first else None,
                          "p95": round(pct(first, 0.95), 1), "max": round(max(first, default=float("nan")), 1)},
        "underruns": sum(s.underruns for s in ok), "streams_underrun": sum(1 for s in ok if s.underruns),
        "rtf_p50": round(statistics.median([s.total_s / s.audio_s for s in ok if s.audio_s]), 3) if ok else None,
        "rtf_max": round(max([s.total_s / s.audio_s for s in ok if s.audio_s], default=float("nan")), 3),
    }


def stage_times(pipeline) -> dict[str, tuple[int, float]]:
    """Each stage's steps and host seconds spent in them so far (ModelRunner's counters)."""
    return {st.name: (st.runner.steps, st.runner.busy_s) for st in pipeline.program.stages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-tts")
    ap.add_argument("--device", default=None)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second (Poisson)")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--load", action="append", default=[], metavar="RATE:REQUESTS",
                    help="one load after another on the same server (repeatable; replaces --rate/--requests); "
                         "a rate of 0 sends all requests at once")
    ap.add_argument("--chars", type=int, default=200, help="input length")
    ap.add_argument("--max-frames", type=int, default=50, help="reply cap in codec frames")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    loads = [(float(r), int(n)) for r, n in (x.split(":") for x in args.load)] or [(args.rate, args.requests)]
    device = args.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    pipeline = build_pipeline(args.model, device=device)
    cfg = ServerConfig(max_sessions=max(64, *(n for _, n in loads)), data_dir=Path(tempfile.mkdtemp()),
                       limits=Limits(max_frames=args.max_frames))
    results = []
    with pipeline, running(pipeline, cfg) as (url, _):
        asyncio.run(load(url, 1.0, 1, args.chars, args.seed))  # warm-up
        for rate, n in loads:
            before, t0 = stage_times(pipeline), time.perf_counter()
            results.append(report(asyncio.run(load(url, rate, n, args.chars, args.seed)), rate))
            wall, after = time.perf_counter() - t0, stage_times(pipeline)
            results[-1]["stages"] = {name: {"steps": steps - before[name][0],
                                            "ms_per_step": round(1e3 * (busy - before[name][1])
                                                                 / max(1, steps - before[name][0]), 2),
                                            "busy_share": round((busy - before[name][1]) / wall, 3)}
                                     for name, (steps, busy) in after.items()}
    print(json.dumps({"model": args.model, "device": device, "chars": args.chars, "max_frames": args.max_frames,
                      "loads": results}))


if __name__ == "__main__":
    main()
