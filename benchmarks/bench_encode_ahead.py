"""Encode while speaking: commit-time audio encoding with and without AudioStream, on CPU.

    python -m benchmarks.bench_encode_ahead --size tiny      # the tiny preset's audio encoder
    python -m benchmarks.bench_encode_ahead --size full      # the real config's encoder (random weights)
    python -m benchmarks.bench_encode_ahead --live           # the live server, tiny model (see live())

For a 3 s and a 20 s question streamed in 100 ms pieces: the time of log-mel + encoder on the whole
buffer at the commit, against AudioStream.finish() after the pieces were pushed (what a commit costs
when the final parts were encoded as the audio arrived), and the time spent in the pushes.

`--live`: the same questions (speech-like, 24 kHz PCM16) appended in real time to the real server on loopback
(tiny model), manual commit + response.create, with encode-ahead on and off (`Limits.encode_ahead`, two servers on
one engine, turns alternating): commit sent -> `committed` and -> first audio delta, and the engine's audio-encoder
step time of the turn (what the commit still had to encode), medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from models.qwen3_omni.audio_encoder import AudioEncoder
from models.qwen3_omni.audio_features import log_mel
from models.qwen3_omni.audio_stream import AudioStream
from models.qwen3_omni.config import AudioEncoderConfig
from models.qwen3_omni.tiny import tiny_config
from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import client, next_event, pcm16_b64, running, until
from tests.speech import speech_like

FULL = Path(__file__).resolve().parents[2] / "shared" / "reference" / "qwen3_omni_30b_a3b_config.json"


def encoder(size: str) -> AudioEncoder:
    if size == "tiny":
        d = tiny_config("a")["thinker_config"]["audio_config"]
    else:
        d = json.loads(FULL.read_text())["thinker_config"]["audio_config"]
    torch.manual_seed(0)
    enc = AudioEncoder(AudioEncoderConfig.from_hf(d)).eval()
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.02)
    return enc


def question(seconds: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(seconds))
    n = int(seconds * 16000)
    return torch.randn(n, generator=g) * 0.05 * ((torch.arange(n) // 4000) % 3 != 2)


def run(enc: AudioEncoder, seconds: float, repeats: int) -> dict:
    audio = question(seconds)
    whole, ahead, pushes = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.inference_mode():
            feats, mask = log_mel([audio])
            enc(feats[0, :, : int(mask.sum())])
        whole.append(time.perf_counter() - t0)
        stream, pushed = AudioStream(enc), 0.0
        for start in range(0, audio.numel(), 1600):
            t1 = time.perf_counter()
            stream.push(audio[start : start + 1600])
            pushed += time.perf_counter() - t1
        t2 = time.perf_counter()
        stream.finish()
        ahead.append(time.perf_counter() - t2)
        pushes.append(pushed)
    ms = lambda xs: round(statistics.median(xs) * 1e3, 1)  # noqa: E731
    return {"seconds": seconds, "whole_ms": ms(whole), "commit_ms": ms(ahead), "pushes_ms": ms(pushes),
            "windows_cached": stream.cached_windows, "chunks_cached": stream.cached_chunks}


async def live_turn(url: str, audio: np.ndarray) -> tuple[float, float]:
    """(commit -> committed, commit -> first audio delta) in ms, the question appended in real time."""
    async with client(url).realtime.connect(model="qwen3-omni") as conn:
        await next_event(conn)
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await until(conn, "session.updated")
        start = time.perf_counter()
        for n, i in enumerate(range(0, len(audio), 2400)):
            await conn.input_audio_buffer.append(audio=pcm16_b64(audio[i : i + 2400]))
            await asyncio.sleep(max(0.0, start + (n + 1) * 0.1 - time.perf_counter()))
        t0 = time.perf_counter()
        await conn.input_audio_buffer.commit()
        await until(conn, "input_audio_buffer.committed")
        committed = time.perf_counter() - t0
        await conn.response.create()
        await until(conn, "response.output_audio.delta")
        first = time.perf_counter() - t0
        await until(conn, "response.done")
        return committed * 1e3, first * 1e3


def encoder_busy_ms(p) -> float:
    """Time the engine's audio-encoder stage has spent in its steps so far (the commit-time encoding)."""
    return p.request(lambda: next(s.runner.busy_s for s in p.stages if s.name == "audio_encoder")).result() * 1e3


def live(repeats: int) -> None:
    limits = {"max_text_tokens": 8, "max_frames": 6}
    with build_pipeline("tiny") as p, running(p, ServerConfig(limits=Limits(**limits))) as on, \
            running(p, ServerConfig(limits=Limits(**limits, encode_ahead=False))) as off:
        for seconds in (3.0, 20.0):
            audio = speech_like(seconds, 24000, int(seconds))
            rows: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
            before = p.stats()["audio_ahead"]
            for _ in range(repeats):
                for mode, (url, _) in (("on", on), ("off", off)):
                    busy = encoder_busy_ms(p)
                    committed, first = asyncio.run(live_turn(url, audio))
                    rows[mode].append((committed, first, encoder_busy_ms(p) - busy))
            after = p.stats()["audio_ahead"]
            med = lambda xs, k: round(statistics.median(x[k] for x in xs), 1)  # noqa: E731
            print(json.dumps({"seconds": seconds, **{f"{m}_commit_to_committed_ms": med(r, 0) for m, r in rows.items()},
                              **{f"{m}_commit_to_first_audio_ms": med(r, 1) for m, r in rows.items()},
                              **{f"{m}_encoder_step_ms": med(r, 2) for m, r in rows.items()},
                              "turns_encoded_ahead": after["turns"] - before["turns"],
                              "chunks_cached": after["chunks_cached"] - before["chunks_cached"]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=["tiny", "full"], default="tiny")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--live", action="store_true", help="through the live server (tiny model)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.live:
        return live(args.repeats)
    enc = encoder(args.size)
    for seconds in (3.0, 20.0):
        print(json.dumps({"size": args.size, **run(enc, seconds, args.repeats)}), flush=True)


if __name__ == "__main__":
    main()
