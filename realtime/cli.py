"""The `omni-realtime` command: `serve` (the gateway) and `generate` (one offline turn, same pipeline). Errors are one
line on stderr and exit code 2 (`--debug` shows the traceback)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import ssl
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from . import logs
from .cli_checks import (
    UsageError,
    check_before_loading,
    check_out,
    check_positive,
    check_speaking,
    default_device,
    default_threads,
    read_audio,
)

TINY_REPLY_TOKENS, TINY_REPLY_FRAMES = 32, 50  # a tiny random model never stops by itself


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:  # only defaults the help text does not state
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def package_version() -> str:
    try:
        return version("omni-realtime")
    except PackageNotFoundError:
        return "unknown"


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="checkpoint directory, or a built-in tiny test model's preset "
                   "name ('tiny')")
    p.add_argument("--voice-model", default="", help="speak the replies in this model's voices (a checkpoint "
                   "directory, or a preset that can be a voice) (default: none, the model's own)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="weights and activations (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--quantization", default=None, choices=["fp8"], help="fp8: quantize the MoE experts' weights "
                   "at load to e4m3 with 128x128 block scales (default: none, the weights as stored)")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="run every step eagerly on CUDA (default: capture the fixed-shape steps at start)")
    p.add_argument("--no-triton", action="store_true", help="run the steps on torch's kernels, not ours (Triton): "
                   "to compare, or to route around a misbehaving kernel (default: ours on CUDA)")
    p.add_argument("--kv-cache-gib", type=float, default=None, help="GiB for the model's KV caches on CUDA (default: "
                   "what is free after the weights, within --gpu-memory-gib, less the model's headroom for CUDA "
                   "graphs and activations: 4-12 GiB, README)")
    p.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="on CUDA, the most GiB this process may take (weights, KV caches, CUDA graphs; more is an "
                        "out-of-memory error); refused on cpu (default: the whole device)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level")
    p.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="omni-realtime", description="Realtime voice server for speech models "
                                 "(the OpenAI Realtime protocol)")
    ap.add_argument("--version", action="version", version=f"omni-realtime {package_version()}")
    sub = ap.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the OpenAI-Realtime-compatible WebSocket server",
                           formatter_class=HelpFormatter,
                           description="Serve the Realtime protocol at /v1/realtime and the browser demo at /. With "
                                       f"--model tiny a reply stops after {TINY_REPLY_TOKENS} text tokens (unless the "
                                       f"client sets max_output_tokens) and {TINY_REPLY_FRAMES} codec frames of "
                                       "speech; checkpoints keep the model's limits (1024 tokens, 120 s).")
    add_common_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    serve.add_argument("--api-key", default=os.environ.get("OMNI_REALTIME_API_KEY"), help="require this key (Bearer "
                       "header or browser subprotocol) (default: env OMNI_REALTIME_API_KEY, else no key)")
    serve.add_argument("--ssl-certfile", help="serve HTTPS/WSS with this PEM certificate (browsers on other "
                                              "machines need HTTPS for the microphone)")
    serve.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    serve.add_argument("--max-sessions", type=int, default=32, help="beyond this, new sockets close with 1013")
    serve.add_argument("--max-session-minutes", type=float, default=60.0, help="a session's longest life")
    serve.add_argument("--model-name", default="", help="the model id that /v1/models reports (default: the "
                       "model's own name)")
    serve.add_argument("--api-key-file", help="read the key from this file (keeps it out of `ps`)")
    serve.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: 1 on CUDA, min(4, cores) on CPU); audio work uses 2 more")
    serve.add_argument("--gil-switch-ms", type=float, default=0.1,
                       help="the longest a thread holds Python's GIL while another waits for it (Python's default: 5); "
                       "short, so the engine thread gets it back soon from the threads serving the sockets")
    serve.add_argument("--allowed-origins", default="",
                       help="comma-separated browser origins allowed besides the server's own host, or '*'")
    serve.add_argument("--max-sessions-per-client", type=int, default=16, help="sessions per client address")
    serve.add_argument("--no-encode-ahead", action="store_true", help="encode input audio at the commit, not as it "
                       "arrives (for comparisons)")
    serve.add_argument("--play-ahead-s", type=float, default=0.0,
                       help="a reply more than this many seconds of audio ahead of its playback waits, so that under "
                       "load the batch rows go to the streams that need them (default 0: generate as fast as possible)")
    serve.add_argument("--drain-seconds", type=float, default=30.0,
                       help="on SIGTERM: turn not-ready, refuse new sessions (1013), let open ones run this long, "
                            "then close the rest (1001) and exit 0; a second signal stops at once")
    serve.add_argument("--drain-notice-seconds", type=float, default=0.0, help="keep taking new sessions this long "
                       "after SIGTERM (the proxy's time to see /health/ready turn 503)")
    serve.add_argument("--data-dir", type=Path, default=None, help="where custom voices are kept (default: "
                       "$XDG_DATA_HOME/omni-realtime, else ~/.local/share/omni-realtime)")
    gen = sub.add_parser("generate", help="answer one turn offline through the streaming pipeline",
                         formatter_class=HelpFormatter, description="Answer one user turn (audio, text or both) "
                         "offline through the same streaming pipeline the server uses: print the reply's text and "
                         "write its speech with --out. With --model tiny the weights are random: the reply is noise.")
    add_common_args(gen)
    gen.add_argument("--audio", help="input audio file (WAV of any PCM width or float, FLAC, OGG, MP3; any rate, "
                                     "channels averaged)")
    gen.add_argument("--text", default="", help="user text (after the audio, when both are given)")
    gen.add_argument("--system", default=None, help="system prompt (default: none)")
    gen.add_argument("--voice", "--speaker", default="", help="one of the model's voices (default: its default "
                     "voice; an unknown name is an error that lists them)")
    gen.add_argument("--language", default="", help="the language to speak, one the model lists (default: auto)")
    gen.add_argument("--instructions", default="", help="a speaking style, for models that take one (e.g. 'speak "
                     "slowly, in a warm voice')")
    gen.add_argument("--reference-audio", help="a voice to clone (audio file, as --audio), for models that clone")
    gen.add_argument("--reference-text", help="what --reference-audio says (cloning in context; without it, from the "
                     "audio's voice alone)")
    gen.add_argument("--greedy", action="store_true", help="argmax decoding in every stage (reproducible)")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed")
    gen.add_argument("--max-text-tokens", type=int, default=512, help="stop the reply text after N tokens")
    gen.add_argument("--max-frames", type=int, default=1500, help="stop the speech after M codec frames")
    gen.add_argument("--no-audio", action="store_true", help="text reply only (a model that does not speak always "
                     "replies in text)")
    gen.add_argument("--out", help="write the reply's speech here (16-bit WAV at the model's output rate)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with ids, codes and timings")
    return ap


def build(args: argparse.Namespace):
    from models.registry import build_pipeline

    return build_pipeline(args.model, args.device or default_device(), args.dtype,
                          graphs=False if args.no_cuda_graphs else None, kv_memory_gib=args.kv_cache_gib,
                          voice_model=args.voice_model, quantization=args.quantization,
                          gpu_memory_gib=args.gpu_memory_gib, triton=not args.no_triton)


def generate(args: argparse.Namespace) -> int:
    from pipelines.types import AudioChunk, GenerationOptions, Message, TextDelta, Turn, TurnDone, TurnError

    from .pcm import resample
    from .wav import write_wav

    if not args.audio and not args.text:
        raise UsageError("give --audio, --text or both")
    check_speaking(check_before_loading(args), args)
    if args.out:
        check_out(args.out)
    messages = [Message("system", args.system)] if args.system else []
    samples, rate = read_audio(args.audio) if args.audio else (None, 0)
    reference, ref_rate = read_audio(args.reference_audio, "--reference-audio") if args.reference_audio else (None, 0)
    with build(args) as pipeline:
        spec = pipeline.spec
        if samples is not None and not spec.hears:
            raise UsageError(f"--audio: this model ({spec.name}) takes no audio input")
        if args.out and not spec.speaks:
            raise UsageError(f"--out: this model ({spec.name}) does not speak; it replies in text")
        audio = None if samples is None else resample(samples, rate, spec.input_rate)
        messages.append(Message("user", args.text, audio))
        if reference is not None:
            reference = resample(reference, ref_rate, spec.output_rate)
        opts = GenerationOptions(audio=spec.speaks and not args.no_audio, voice=args.voice, greedy=args.greedy,
                                 seed=args.seed, max_text_tokens=args.max_text_tokens, max_frames=args.max_frames,
                                 language=args.language, instructions=args.instructions, reference_audio=reference,
                                 reference_text=args.reference_text or "")
        events = pipeline.run(Turn("cli", messages, opts))
    end = events[-1]
    if isinstance(end, TurnError):
        print(f"generate failed: {end.code}: {end.message}", file=sys.stderr)
        return 1
    assert isinstance(end, TurnDone)
    pcm = [e.pcm for e in events if isinstance(e, AudioChunk)]
    wav = np.concatenate(pcm) if pcm else np.zeros(0, dtype=np.float32)
    if args.out:
        write_wav(args.out, wav, spec.output_rate)
    if args.json:
        print(json.dumps({"text": end.text, "text_ids": list(end.text_ids), "codes": [list(c) for c in end.codes],
                          "audio_seconds": len(wav) / spec.output_rate if spec.speaks else 0.0, "status": end.status,
                          "time_to_first_audio_ms": end.timings.get("first_audio_ms"), "rtf": end.timings.get("rtf"),
                          "timings": end.timings}))
    else:
        print("".join(e.text for e in events if isinstance(e, TextDelta)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.setup(args.log_level, args.log_json)
    try:
        return generate(args) if args.command == "generate" else serve(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if args.debug:
            raise
        text = str(e) if isinstance(e, UsageError | OSError | ValueError) else f"{type(e).__name__}: {e}"
        hint = "" if isinstance(e, UsageError | OSError) else " (--debug shows the traceback)"
        print(f"omni-realtime {args.command}: error: {text}{hint}", file=sys.stderr)
        return 2


def listen(host: str, port: int) -> socket.socket:
    """Bind now, before the model loads, so a port in use is a one-line error at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {os.strerror(e.errno) if e.errno else e} "
                         "(is another server running there? pick another --port)") from None


def tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.ssl_certfile and not args.ssl_keyfile:
        return None
    if not args.ssl_certfile:
        raise UsageError("--ssl-keyfile needs --ssl-certfile")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"cannot load the TLS certificate {args.ssl_certfile}: {e.strerror or e}") from None
    return ctx


def serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .drain import DrainConfig
    from .security import Gate
    from .server import ServerConfig, run
    from .session import Limits

    if args.threads is None:
        args.threads = default_threads(args.device or default_device())
    check_positive(args, "max_sessions", "max_session_minutes", "threads", "max_sessions_per_client")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a TCP port is 0-65535 (0: any free port)")
    check_positive(args, "drain_seconds", "drain_notice_seconds", "play_ahead_s", zero_ok=True)
    check_positive(args, "gil_switch_ms")
    check_before_loading(args)
    import torch

    torch.set_num_threads(args.threads)
    key = args.api_key
    origins = tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as e:
            raise UsageError(f"--api-key-file {args.api_key_file}: {e.strerror}") from None
    try:
        Gate(key, origins)
    except ValueError as e:
        raise UsageError(str(e)) from None
    args.api_key = key
    ssl_context = tls(args)
    sock = listen(args.host, args.port)
    pipeline = build(args)
    pipeline.play_ahead_s = args.play_ahead_s
    limits = Limits(max_text_tokens=TINY_REPLY_TOKENS, max_frames=TINY_REPLY_FRAMES) \
        if args.model == pipeline.spec.tiny else Limits()
    limits = replace(limits, encode_ahead=not args.no_encode_ahead and pipeline.audio_ahead() is not None)
    cfg = ServerConfig(model_name=args.model_name, api_key=key or None, max_sessions=args.max_sessions, limits=limits,
                       max_session_s=args.max_session_minutes * 60, bind_host=args.host, allowed_origins=origins,
                       max_sessions_per_client=args.max_sessions_per_client, gil_switch_ms=args.gil_switch_ms,
                       drain=DrainConfig(args.drain_seconds, args.drain_notice_seconds), data_dir=args.data_dir)
    run(pipeline, cfg, sock, ssl_context,
        started=lambda: startup_line(args, sock, ssl_context is not None, limits.encode_ahead))
    return 0


def demo_host(args: argparse.Namespace) -> str:
    """A host the demo URL works with: without a key the server takes only addresses, localhost and the
    allowed origins' names (no DNS rebinding), so a wildcard bind shows this machine's address."""
    if args.host not in ("0.0.0.0", "::", ""):
        return args.host
    name = socket.gethostname()
    if args.api_key or "*" in args.allowed_origins or f"//{name}:" in args.allowed_origins or \
            args.allowed_origins.endswith(f"//{name}"):
        return name
    family, probe = (socket.AF_INET6, "fd00::1") if args.host == "::" else (socket.AF_INET, "10.255.255.255")
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((probe, 9))  # no packet is sent: this only picks the interface a route would use
            return s.getsockname()[0]
    except OSError:
        return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def startup_line(args: argparse.Namespace, sock: socket.socket, https: bool, encode_ahead: bool) -> None:
    port = sock.getsockname()[1]
    host = demo_host(args)
    host = f"[{host}]" if ":" in host else host
    device = args.device or default_device()
    logs.event("serving", demo=f"{'https' if https else 'http'}://{host}:{port}/", model=args.model,
               device=device, dtype=args.dtype or ("bfloat16" if device.startswith("cuda") else "float32"),
               api_key="required" if args.api_key else "none", version=package_version(), encode_ahead=encode_ahead)
    if not https and args.host not in ("127.0.0.1", "localhost", "::1"):
        logs.event("no_tls", logging.WARNING, note="browsers on other machines may use the microphone only over "
                   "HTTPS: add --ssl-certfile/--ssl-keyfile")


if __name__ == "__main__":
    sys.exit(main())
