"""The `omni-realtime` command: `serve` (the gateway) and `generate` (one offline turn, same pipeline)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np
import torch


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="checkpoint directory, or 'tiny' for the built-in test model")
    p.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="weights and activations (default: bfloat16 on cuda, float32 on cpu)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="omni-realtime", description="Qwen3-Omni realtime voice server")
    sub = ap.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the OpenAI-Realtime-compatible WebSocket server")
    add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    serve.add_argument("--api-key", default=os.environ.get("OMNI_REALTIME_API_KEY"),
                       help="require this key (Bearer header or browser subprotocol); env OMNI_REALTIME_API_KEY")
    serve.add_argument("--max-sessions", type=int, default=32, help="beyond this, new sockets close with 1013")
    serve.add_argument("--max-session-minutes", type=float, default=60.0, help="a session's longest life")
    serve.add_argument("--model-name", default="qwen3-omni", help="the model id that /v1/models reports")
    serve.add_argument("--api-key-file", help="read the key from this file (keeps it out of `ps`)")
    serve.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1),
                       help="torch CPU threads (default: min(4, cores)); audio work uses 2 more")
    serve.add_argument("--allowed-origins", default="",
                       help="comma-separated browser origins allowed besides the server's own host, or '*'")
    serve.add_argument("--max-sessions-per-client", type=int, default=16, help="sessions per client address")
    gen = sub.add_parser("generate", help="answer one turn offline through the streaming pipeline")
    add_model_args(gen)
    gen.add_argument("--audio", help="input WAV (16-bit PCM or float32, any rate, mono or stereo)")
    gen.add_argument("--text", default="", help="user text (after the audio, when both are given)")
    gen.add_argument("--system", default=None, help="system prompt (default: none)")
    gen.add_argument("--speaker", default="ethan", help="voice (ethan, chelsie, aiden)")
    gen.add_argument("--greedy", action="store_true", help="argmax decoding in every stage (reproducible)")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed")
    gen.add_argument("--max-text-tokens", type=int, default=512, help="stop the reply text after N tokens")
    gen.add_argument("--max-frames", type=int, default=1500, help="stop the speech after M codec frames (80 ms each)")
    gen.add_argument("--no-audio", action="store_true", help="text reply only (no talker, no Code2Wav)")
    gen.add_argument("--out", help="write the reply's speech here (24 kHz 16-bit WAV)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with ids, codes and timings")
    return ap


def generate(args: argparse.Namespace) -> int:
    from models.qwen3_omni.audio_features import resample
    from models.registry import build_pipeline
    from pipelines.types import AudioChunk, GenerationOptions, Message, TextDelta, Turn, TurnDone, TurnError

    from .wav import read_wav, write_wav

    messages = []
    if args.system:
        messages.append(Message("system", args.system))
    audio = None
    if args.audio:
        samples, rate = read_wav(args.audio)
        audio = resample(samples, rate, 16000) if rate != 16000 else samples
    if audio is None and not args.text:
        print("generate: give --audio, --text or both", file=sys.stderr)
        return 2
    messages.append(Message("user", args.text, audio))
    opts = GenerationOptions(
        audio=not args.no_audio, speaker=args.speaker, greedy=args.greedy, seed=args.seed,
        max_text_tokens=args.max_text_tokens, max_frames=args.max_frames,
    )
    with build_pipeline(args.model, args.device or default_device(), args.dtype) as pipeline:
        events = pipeline.run(Turn("cli", messages, opts))
    end = events[-1]
    if isinstance(end, TurnError):
        print(f"generate failed: {end.code}: {end.message}", file=sys.stderr)
        return 1
    assert isinstance(end, TurnDone)
    pcm = [e.pcm for e in events if isinstance(e, AudioChunk)]
    wav = np.concatenate(pcm) if pcm else np.zeros(0, dtype=np.float32)
    if args.out:
        write_wav(args.out, wav)
    if args.json:
        print(json.dumps({
            "text": end.text, "text_ids": list(end.text_ids), "codes": [list(c) for c in end.codes],
            "audio_seconds": len(wav) / 24000, "status": end.status,
            "time_to_first_audio_ms": end.timings.get("first_audio_ms"), "rtf": end.timings.get("rtf"),
            "timings": end.timings,
        }))
    else:
        print("".join(e.text for e in events if isinstance(e, TextDelta)))
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parser().parse_args(argv)
    if args.command == "generate":
        return generate(args)
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    from models.registry import build_pipeline

    from .security import Gate
    from .server import ServerConfig, run

    if args.max_sessions < 1 or args.max_session_minutes <= 0:
        print("serve: --max-sessions and --max-session-minutes must be positive", file=sys.stderr)
        return 2
    if args.threads < 1 or args.max_sessions_per_client < 1:
        print("serve: --threads and --max-sessions-per-client must be positive", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    key = args.api_key
    origins = tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())
    try:
        if args.api_key_file:
            with open(args.api_key_file) as f:
                key = f.read().strip()
        Gate(key, origins)
    except (OSError, ValueError) as e:
        print(f"serve: {e}", file=sys.stderr)
        return 2
    pipeline = build_pipeline(args.model, args.device or default_device(), args.dtype)
    cfg = ServerConfig(model_name=args.model_name, api_key=key or None, max_sessions=args.max_sessions,
                       max_session_s=args.max_session_minutes * 60, bind_host=args.host, allowed_origins=origins,
                       max_sessions_per_client=args.max_sessions_per_client)
    run(pipeline, cfg, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
