"""Turn taking through the real server: spoken turns streamed in real time, timed from the end of speech.

The corpus (benchmarks/turn_corpus.py: espeak-ng speech, sox pink noise): every sentence whole and with one
mid-sentence pause (300-900 ms, cycling), under pink noise at 10, 15 or 20 dB SNR (cycling). Each turn is one new
session of `omni-realtime serve` (a child process), streamed as 20 ms appends of 24 kHz PCM16 in real time, with
2 s of the same noise after the last word. The server encodes the input audio as it arrives unless
`--no-encode-ahead` (the result's meta and summary say which, as the server's startup line reported it). Per turn:

- eos_to_commit_ms: end of speech (when the append holding the last word was sent) -> the turn's final
  `input_audio_buffer.committed` (the one whose speech_stopped falls after the last word);
- eos_to_audio_ms: end of speech -> the first `response.output_audio.delta` after that commit;
- false_cuts: speech_stopped events (each a commit and a reply) that fell before the last word: the user was
  still mid-sentence.

The socket closes at the final turn's first audio delta (replies are capped at 24 tokens + frames, since the
tiny random model never stops by itself).

  python benchmarks/bench_turns.py --out benchmarks/results/turns_cpu_tiny.json   # tiny model on CPU
  python benchmarks/bench_turns.py --model /models/qwen3-omni --device cuda          # full size
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import pickle
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.turn_corpus import RATE, SENTENCES, Utterance, utterance, with_noise  # noqa: E402
from realtime.pcm import float_to_pcm16, resample  # noqa: E402
from tests.serve_process import serve  # noqa: E402

APPEND_S = 0.02
MODES = {"server_vad": {"type": "server_vad"}, "semantic_vad": {"type": "semantic_vad", "eagerness": "auto"},
         "server_vad_200": {"type": "server_vad", "silence_duration_ms": 200}}


def corpus() -> list[tuple[Utterance, int]]:
    """(utterance, pause ms or 0)."""
    turns = []
    for i in range(len(SENTENCES)):
        pause = (300, 500, 700, 900)[i % 4]
        for kind, p in (("whole", 0), ("paused", pause)):
            u = utterance(i, kind, pause_ms=pause or 300, lead_ms=500, tail_ms=2000)
            turns.append((with_noise(u, (10, 15, 20)[(2 * i + len(kind)) % 3], seed=i), p))
    return turns


def chunks(u: Utterance) -> list[str]:
    pcm = float_to_pcm16(resample(torch.from_numpy(u.audio), RATE, 24000).clamp(-1, 1))
    step = round(24000 * APPEND_S) * 2
    return [base64.b64encode(pcm[i : i + step]).decode() for i in range(0, len(pcm), step)]


async def one_turn(url: str, u: Utterance, td: dict, timeout_s: float) -> dict:
    events: list[tuple[float, dict]] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:

        async def read() -> None:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    ev = json.loads(msg.data)
                    if ev["type"] != "response.output_audio.delta" or not any(
                            e["type"] == "response.output_audio.delta" for _, e in events[-1:]):
                        events.append((time.perf_counter(), ev))

        reader = asyncio.create_task(read())
        await ws.send_json({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 24, "audio": {"input": {"turn_detection": td}}}})
        t0 = time.perf_counter()
        for i, chunk in enumerate(chunks(u)):
            await asyncio.sleep(max(0.0, t0 + i * APPEND_S - time.perf_counter()))
            await ws.send_json({"type": "input_audio_buffer.append", "audio": chunk})
        eos = t0 + math.floor(u.speech_end_s / APPEND_S) * APPEND_S
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline and not _done_after(events, u):
            await asyncio.sleep(0.05)
        await ws.close()
        reader.cancel()
    return _measure(u, events, eos)


def _final_stop(events: list[tuple[float, dict]], u: Utterance) -> int | None:
    stops = [i for i, (_, e) in enumerate(events) if e["type"] == "input_audio_buffer.speech_stopped"
             and e["audio_end_ms"] > u.speech_end_s * 1000]
    return stops[0] if stops else None


def _done_after(events: list[tuple[float, dict]], u: Utterance) -> bool:
    k = _final_stop(events, u)
    return k is not None and any(e["type"] == "response.output_audio.delta" for _, e in events[k:])


def _measure(u: Utterance, events: list[tuple[float, dict]], eos: float) -> dict:
    cuts = [e for _, e in events if e["type"] == "input_audio_buffer.speech_stopped"
            and e["audio_end_ms"] <= u.speech_end_s * 1000]
    out = {"name": u.name, "false_cuts": len(cuts), "eos_to_commit_ms": None, "eos_to_audio_ms": None,
           "errors": [e["error"].get("code") for _, e in events if e["type"] == "error"]}
    k = _final_stop(events, u)
    if k is None:
        return out
    after = events[k:]
    commit = next((t for t, e in after if e["type"] == "input_audio_buffer.committed"), None)
    audio = next((t for t, e in after if e["type"] == "response.output_audio.delta"), None)
    out["eos_to_commit_ms"] = None if commit is None else round((commit - eos) * 1e3, 1)
    out["eos_to_audio_ms"] = None if audio is None else round((audio - eos) * 1e3, 1)
    return out


def summary(turns: list[dict]) -> dict:
    def p50(key: str, rows: list[dict]) -> float | None:
        xs = [t[key] for t in rows if t[key] is not None]
        return round(statistics.median(xs), 1) if xs else None

    paused = [t for t in turns if t["name"].startswith("paused")]
    return {"turns": len(turns), "missed": sum(t["eos_to_commit_ms"] is None for t in turns),
            "eos_to_commit_p50_ms": p50("eos_to_commit_ms", turns),
            "eos_to_audio_p50_ms": p50("eos_to_audio_ms", turns),
            "eos_to_audio_p50_ms_whole": p50("eos_to_audio_ms", [t for t in turns if t["name"].startswith("whole")]),
            "false_cuts": sum(t["false_cuts"] for t in turns),
            "paused_turns_cut": sum(t["false_cuts"] > 0 for t in paused), "paused_turns": len(paused),
            "errors": sum(len(t["errors"]) for t in turns)}


def cached_corpus(path: Path | None) -> list[tuple[Utterance, int]]:
    """The corpus, kept in `path` (a pickle) so that a machine without espeak-ng and sox can run it."""
    if path is not None and path.is_file():
        return pickle.loads(path.read_bytes())
    turns = corpus()
    if path is not None:
        path.write_bytes(pickle.dumps(turns))
    return turns


async def bench(url: str, modes: list[str], timeout_s: float, turns: list[tuple[Utterance, int]]) -> dict:
    result: dict = {}
    for mode in modes:
        rows = []
        for u, pause in turns:
            row = await one_turn(url, u, MODES[mode], timeout_s)
            row["pause_ms"] = pause
            rows.append(row)
            print(mode, json.dumps(row), flush=True)
        result[mode] = {"summary": summary(rows), "turns": rows}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default="server_vad,semantic_vad")
    ap.add_argument("--limit", type=int, default=None, help="only the first N turns of the corpus")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="per turn, after the audio")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--corpus", type=Path, default=None, help="a pickle of the corpus: read if it exists, else written")
    ap.add_argument("--full-random", action="store_true",
                    help="serve in this process the full-size model with random weights (benchmarks/bench_pipeline.py)")
    ap.add_argument("--no-encode-ahead", action="store_true", help="the server encodes input audio at the commit")
    args = ap.parse_args()
    turns = cached_corpus(args.corpus)[:args.limit]
    if args.full_random:
        from benchmarks.bench_pipeline import random_program
        from pipelines.pipeline import Pipeline
        from realtime.server import ServerConfig
        from realtime.session import Limits
        from tests.loopback import running

        _, program = random_program(False, args.device, None)
        limits = Limits(encode_ahead=not args.no_encode_ahead)
        with Pipeline(program) as pipeline, running(pipeline, ServerConfig(limits=limits)) as (base, _):
            url, ahead, t = base.replace("http", "ws", 1) + "/realtime", limits.encode_ahead, time.time()
            res = asyncio.run(bench(url, args.modes.split(","), args.timeout_s, turns))
    else:
        flags = ["--no-encode-ahead"] if args.no_encode_ahead else []
        with serve("--model", args.model, "--device", args.device, *flags, timeout=300) as served:
            url = served.url.replace("http", "ws", 1).rstrip("/") + "/v1/realtime"
            ahead = served.wait_for(lambda r: r.get("message") == "serving")["encode_ahead"]  # as the server says
            t = time.time()
            res = asyncio.run(bench(url, args.modes.split(","), args.timeout_s, turns))
    res["meta"] = {"model": "full-size random" if args.full_random else args.model, "device": args.device,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)), "command": " ".join(sys.argv),
                   "presets": "realtime/turn_presets.py", "encode_ahead": ahead}
    text = json.dumps(res, indent=1)
    if args.out:
        args.out.write_text(text)
    print(json.dumps({"encode_ahead": ahead, **{m: res[m]["summary"] for m in args.modes.split(",")}}, indent=1))


if __name__ == "__main__":
    main()
