"""Time to first audio and real-time factor of our streaming pipeline, random weights, any size.

Same workload as ../shared/reference/hf_reference_bench.py (3 s of audio, a 32-token system prompt,
16 reply tokens, 25 codec frames, lengths forced), run through the real Pipeline: the thinker's
prefill, the talker starting on the first reply token, Code2Wav streaming each frame. Run both in the
same device call and report ratios.

  python benchmarks/bench_pipeline.py                      # full size on CUDA, bf16
  python benchmarks/bench_pipeline.py --tiny --device cpu  # smoke test
  python benchmarks/bench_pipeline.py --concurrency 1,4,8 --check --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.common.tokenizer import Tokenizer  # noqa: E402
from models.qwen3_omni.config import OmniConfig  # noqa: E402
from models.qwen3_omni.model import random_model  # noqa: E402
from models.qwen3_omni.placement import PipelineConfig  # noqa: E402
from models.qwen3_omni.program import Qwen3OmniProgram  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config  # noqa: E402
from pipelines.pipeline import Pipeline  # noqa: E402
from pipelines.types import AudioChunk, GenerationOptions, Message, TextDelta, Turn, TurnDone  # noqa: E402
from realtime.pcm import resample  # noqa: E402


def speech_like(seconds: float) -> torch.Tensor:
    t = torch.arange(int(seconds * 16000)) / 16000
    phase = 2 * torch.pi * torch.cumsum(140 + 40 * torch.sin(2 * torch.pi * 1.5 * t), 0) / 16000
    return sum(torch.sin(k * phase) / k for k in range(1, 5)) * 0.2 + 0.02 * torch.randn(t.shape)


async def one_turn(pipeline: Pipeline, session: str, messages: list[Message], opts: GenerationOptions) -> dict:
    start = time.perf_counter()
    first_text = first_audio = last_text = last_audio = None
    samples = 0
    async for event in pipeline.submit(Turn(session, messages, opts)):
        now = time.perf_counter()
        if isinstance(event, TextDelta):
            first_text, last_text = first_text or now, now
        elif isinstance(event, AudioChunk):
            first_audio, last_audio = first_audio or now, now
            samples += len(event.pcm)
        elif isinstance(event, TurnDone):
            assert len(event.text_ids) == opts.max_text_tokens and len(event.codes) == opts.max_frames, event.status
        else:
            raise RuntimeError(f"turn failed: {event}")
    total = time.perf_counter() - start
    return {"ttfa_ms": (first_audio - start) * 1e3, "first_text_ms": (first_text - start) * 1e3,
            "total_ms": total * 1e3, "audio_s": samples / 24000, "rtf": total / (samples / 24000),
            "text_ms_per_token": (last_text - first_text) * 1e3 / max(1, opts.max_text_tokens - 1),
            "audio_ms_per_frame": (last_audio - first_audio) * 1e3 / max(1, opts.max_frames - 1)}


async def run_level(pipeline: Pipeline, n: int, rep: int, messages: list[Message], opts: GenerationOptions) -> list:
    return await asyncio.gather(*(one_turn(pipeline, f"c{n}r{rep}s{i}", messages, opts) for i in range(n)))


async def gateway_turns(pipeline: Pipeline, reps: int, audio: torch.Tensor, system: str, text_tokens: int,
                        frames: int) -> list[dict]:
    """The same turn through the real server and a WebSocket client on loopback: time from sending
    `input_audio_buffer.commit` (+ `response.create`) to the first `response.output_audio.delta`."""
    import base64

    import aiohttp
    from aiohttp import web

    from realtime.server import Server, ServerConfig
    from realtime.session import Limits

    server = Server(pipeline, ServerConfig(limits=Limits(max_text_tokens=text_tokens, max_frames=frames)))
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"ws://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/realtime?model=qwen3-omni"
    pcm = resample(audio, 16000, 24000)
    chunks = [base64.b64encode((pcm[i : i + 2400].clamp(-1, 1) * 32767).to(torch.int16).numpy().tobytes()).decode()
              for i in range(0, len(pcm), 2400)]
    out = []
    async with aiohttp.ClientSession() as http:
        for _ in range(reps + 1):  # the first is a warm-up
            async with http.ws_connect(url, max_msg_size=0) as ws:
                await ws.receive_json()
                await ws.send_json({"type": "session.update", "session": {
                    "type": "realtime", "instructions": system, "audio": {"input": {"turn_detection": None}}}})
                await ws.receive_json()
                for c in chunks:
                    await ws.send_json({"type": "input_audio_buffer.append", "audio": c})
                start = time.perf_counter()
                await ws.send_json({"type": "input_audio_buffer.commit"})
                await ws.send_json({"type": "response.create"})
                first, samples = None, 0
                while True:
                    ev = await ws.receive_json()
                    if ev["type"] == "response.output_audio.delta":
                        first = first or time.perf_counter()
                        samples += len(base64.b64decode(ev["delta"])) // 2
                    elif ev["type"] == "response.done":
                        break
                total = time.perf_counter() - start
                out.append({"ttfa_ms": (first - start) * 1e3, "total_ms": total * 1e3,
                            "audio_s": samples / 24000, "rtf": total / (samples / 24000)})
    await runner.cleanup()
    return out[1:]


def random_program(tiny: bool, device: str, dtype: str | None, voice: object = None,
                   quantization: str | None = None, **stage_overrides: dict) -> tuple[dict, Qwen3OmniProgram]:
    """The benchmarks' model: full size (or tiny) with seeded random weights, and its program (CUDA
    graphs and KV sizing as `PipelineConfig.on` sets them; `voice`: another model's, pipelines/voice.py;
    `quantization` "fp8": the experts kept in fp8 as `--quantization fp8` keeps them; `stage_overrides`:
    StageConfig fields by stage name). Returns (result header, program)."""
    dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    torch.manual_seed(0)
    cfg = OmniConfig.from_hf(tiny_config("a") if tiny else json.loads(FULL_CONFIG.read_text()))
    header: dict = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                    "torch": torch.__version__, "dtype": dtype, "size": "tiny" if tiny else "full"}
    t0 = time.perf_counter()
    model = random_model(cfg, device, getattr(torch, dtype), quantization=quantization)
    if quantization:
        header["quantization"] = quantization
    header["build_s"] = round(time.perf_counter() - t0, 1)
    if device.startswith("cuda"):
        header["weights_GiB"] = round(torch.cuda.memory_allocated() / 2**30, 1)
        header["load_peak_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    header["params_B"] = round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
    cfg = PipelineConfig.on("random-weights", device, dtype, **stage_overrides)
    return header, Qwen3OmniProgram(model, Tokenizer.builtin(), cfg, voice)


def print_line(res: dict, out: str | None) -> None:
    """A benchmark's result as one JSON line, printed and, with `out`, written there."""
    line = json.dumps(res)
    print(line)
    if out:
        Path(out).write_text(line + "\n")


def stage_times(program: Qwen3OmniProgram) -> dict:
    return {s.name: (s.runner.steps, s.runner.busy_s) for s in program.stages}


def checks(program: Qwen3OmniProgram, device: str) -> dict:
    """bf16 sanity on the device: grouped-matmul experts vs the per-expert loop, streamed vs one-shot
    Code2Wav (relative errors; bf16 lands near 1e-2 at worst)."""
    from models.common import layers
    from models.common.code2wav_batch import Code2WavSlots

    model, out = program.model, {}
    with torch.inference_mode():
        moe = model.thinker.model.layers[0].mlp
        dtype = next(model.parameters()).dtype
        x = torch.randn(64, model.cfg.thinker.text.hidden_size, device=device, dtype=dtype)
        grouped = moe(x)
        use = moe.experts.grouped
        moe.experts.grouped = lambda _x: False
        loop = moe(x)
        moe.experts.grouped = use
        out["moe_grouped_vs_loop_rel"] = float((grouped - loop).float().norm() / loop.float().norm())
        out["moe_grouped_used"] = bool(use(x))
        codes = torch.randint(0, 2048, (1, 16, 12), device=device)
        whole = model.code2wav.decode(codes, clamp=False).float().reshape(-1)
        dec = Code2WavSlots(model.code2wav, 1, device, dtype, clamp=False)
        slot = dec.open()
        parts = [dec.push(slot, codes[..., i]) for i in range(12)]
        streamed = torch.cat([p.reshape(-1) for p in parts]).float()
        out["code2wav_stream_vs_oneshot_rel"] = float((streamed - whole).norm() / whole.norm())
    del layers
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="tiny random model instead of full size")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--audio-seconds", type=float, default=3.0)
    ap.add_argument("--system-tokens", type=int, default=32)
    ap.add_argument("--text-tokens", type=int, default=16)
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", default="1", help="comma-separated numbers of simultaneous sessions")
    ap.add_argument("--check", action="store_true", help="also run bf16 correctness checks on the device")
    ap.add_argument("--gateway", action="store_true", help="also time one session through the WebSocket server")
    ap.add_argument("--out", help="write the JSON result here too")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    res, program = random_program(args.tiny, args.device, args.dtype)
    if args.check:
        res["checks"] = checks(program, args.device)
    system = Message("system", " word" * args.system_tokens)
    messages = [system, Message("user", "", speech_like(args.audio_seconds))]
    opts = GenerationOptions(max_text_tokens=args.text_tokens, max_frames=args.frames, ignore_eos=True)
    levels = [int(x) for x in args.concurrency.split(",")]
    with Pipeline(program) as pipeline:
        asyncio.run(run_level(pipeline, 1, -1, messages, opts))  # warm-up
        for n in levels:
            before = stage_times(program)
            turns = [t for rep in range(args.reps) for t in asyncio.run(run_level(pipeline, n, rep, messages, opts))]
            after = stage_times(program)
            level = {k: round(statistics.median(t[k] for t in turns), 2) for k in turns[0]}
            level["ttfa_ms_max"] = round(max(t["ttfa_ms"] for t in turns), 1)
            level["rtf_max"] = round(max(t["rtf"] for t in turns), 3)
            level["stage_ms_per_step"] = {
                name: round((after[name][1] - before[name][1]) * 1e3 / max(1, after[name][0] - before[name][0]), 2)
                for name in after
            }
            res[f"sessions_{n}"] = level
        if args.gateway:
            turns = asyncio.run(gateway_turns(pipeline, args.reps, messages[1].audio, system.text, args.text_tokens,
                                              args.frames))
            res["gateway_1"] = {k: round(statistics.median(t[k] for t in turns), 2) for k in turns[0]}
    print_line(res, args.out)


if __name__ == "__main__":
    main()
