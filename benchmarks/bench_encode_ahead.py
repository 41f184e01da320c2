"""Encode while speaking: commit-time audio encoding with and without AudioStream, on CPU.

    python -m benchmarks.bench_encode_ahead --size tiny      # the tiny preset's audio encoder
    python -m benchmarks.bench_encode_ahead --size full      # the real config's encoder (random weights)

For a 3 s and a 20 s question streamed in 100 ms pieces: the time of log-mel + encoder on the whole
buffer at the commit, against AudioStream.finish() after the pieces were pushed (what a commit costs
when the final parts were encoded as the audio arrived), and the time spent in the pushes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from models.qwen3_omni.audio_encoder import AudioEncoder
from models.qwen3_omni.audio_features import log_mel
from models.qwen3_omni.audio_stream import AudioStream
from models.qwen3_omni.config import AudioEncoderConfig
from models.qwen3_omni.tiny import tiny_config

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=["tiny", "full"], default="tiny")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    enc = encoder(args.size)
    for seconds in (3.0, 20.0):
        print(json.dumps({"size": args.size, **run(enc, seconds, args.repeats)}), flush=True)


if __name__ == "__main__":
    main()
