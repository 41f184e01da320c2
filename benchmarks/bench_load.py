"""Concurrent sessions through the real WebSocket server: time to first audio, real-time factor, underruns.

Each level runs N sessions against realtime.server.Server on loopback, served from this process on one Pipeline
(random weights, built as bench_pipeline builds them). The clients run in child processes of their own
(--client-processes, 4), as real clients run elsewhere: in the server's process their asyncio work took the GIL
from the engine thread (--clients-in-process: the way it was measured before 2026-12-02's third session), and one
process alone lagged at 128 sessions. A session connects, sets
manual turn detection and a 32-token system prompt, streams its question in real time as 20 ms appends (sessions
start spread evenly over --spread-s), then commits and asks for a response.
Reply lengths are the server Limits (--text-tokens, --frames): every reply runs to them (Limits.ignore_eos), as
every session asks the same questions with the same seed, so on random weights one EOS drawn early would shorten
that turn in most sessions at once (--eos lets replies end there).

- TTFA: commit sent -> first response.output_audio.delta received.
- RTF: commit sent -> response.done, over the seconds of audio received.
- Underruns: a simulated player starts 100 ms after the first delta and plays in real time; when a delta
  arrives after the audio received so far has run out, that is one underrun and the gap is starved time
  (playback then resumes on the new audio). The silence after the last delta is the end, not a gap.
- Errors: error events, responses that end failed or cancelled, socket drops, timeouts, no audio.
- Engine: per stage, the batches run at the level, their mean rows and mean ms; turns that waited at admission
  (pipelines/admission.py) and how long in all.
- The server's side, p50 / p95 ms: from the commit's arrival to the first delta sent (server_ttfa), its audio's
  encoding (commit_input), the engine thread taking a submitted turn (handoff), and how late a timer on the
  server's event loop fires (loop_lag, every 5 ms): what each hop through the loop may wait. The engine's three
  longest iterations (engine.longest_rounds: ms, and per stage its host ms and prefill tokens; a stall shows
  there) and every iteration's p50 / p95 (engine.round_ms_p50_p95) and, with TRITON_CACHE_DIR set, the Triton
  kernels compiled during the level (triton_compiled). The process's garbage collections (gc: a count for each
  generation, the longest and total ms; every thread waits while one runs).

Conversation mode (--turns T above 1; its JSON lines say "mode": "conversation"): each session asks T questions
on one connection; after a reply (response.done) it waits for the reply's playback to end in real time (the
simulated player), then --pause-s (pause_s_min/max: the pauses as taken), then streams the next question. Per
level: TTFA p50/p95 over all turns and over first turns, turns with an underrun of all turns, starved seconds and
starved_fraction (starved seconds over the seconds of reply audio received), errors, RTF. A turn with an error
ends its session; sessions_completed counts those that finished every turn cleanly.

  python benchmarks/bench_load.py                                       # full size on CUDA, 1,8,32,64
  python benchmarks/bench_load.py --tiny --device cpu --sessions 4      # smoke test
  python benchmarks/bench_load.py --turns 3 --frames 75 --spread-s 8 --sessions 64,96,128   # conversations
  python benchmarks/bench_load.py --quantization fp8 --gpu-memory-gib 48 --sessions 1,64  # fp8 within 48 GiB

--voice-model speaks the replies with a Qwen3-TTS voice instead of Qwen3-Omni's talker (its default speaker):
with no value, Qwen3-TTS 1.7B CustomVoice at full size with seeded random weights (tiny-tts with --tiny); or a
checkpoint directory.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import gc
import itertools
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import torch
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_pipeline import random_program, speech_like  # noqa: E402
from benchmarks.gpu_trace import GpuTimeline, summarize  # noqa: E402
from models.common import fp8_moe  # noqa: E402
from models.common.fused import SWITCHES, use_triton  # noqa: E402
from models.common.gpu_memory import cap  # noqa: E402
from models.qwen3_omni.audio_stream import AudioStream  # noqa: E402
from pipelines.admission import FED_S, SETTLE_S  # noqa: E402
from pipelines.graphs import PrefillGraphs  # noqa: E402
from pipelines.pipeline import Pipeline  # noqa: E402
from pipelines.scheduler import URGENT_S  # noqa: E402
from pipelines.types import Turn  # noqa: E402
from realtime.audio import InputStream  # noqa: E402
from realtime.cli_checks import default_threads  # noqa: E402
from realtime.input_audio import AudioWorkers  # noqa: E402
from realtime.pcm import resample  # noqa: E402
from realtime.server import Server, ServerConfig, freeze_loaded  # noqa: E402
from realtime.session import Limits  # noqa: E402

APPEND_S = 0.02
START_BUFFER_S = 0.1


@dataclass
class Player:
    """Plays audio in real time from START_BUFFER_S after its first chunk; stalls (an underrun) when it runs dry."""
    samples: int = 0
    dry_at: float = 0.0  # when the audio received so far runs out
    underruns: int = 0
    starved_s: float = 0.0

    def feed(self, now: float, samples: int) -> None:
        if self.samples == 0:
            self.dry_at = now + START_BUFFER_S
        elif now > self.dry_at:
            self.underruns += 1
            self.starved_s += now - self.dry_at
            self.dry_at = now
        self.dry_at += samples / 24000
        self.samples += samples


@dataclass
class Result:
    errors: list[str] = field(default_factory=list)
    ttfa_ms: float | None = None
    rtf: float | None = None
    text_tokens: int = 0
    frames: int = 0
    player: Player = field(default_factory=Player)
    append_late_ms: float = 0.0  # how far behind the wall clock this client's appends fell (client overload)
    asked_at: float = 0.0  # when the question's first append was due
    done_at: float = 0.0  # when response.done arrived


async def session(http: aiohttp.ClientSession, url: str, chunks: list[str], system: str, delay_s: float,
                  timeout_s: float, turns: int = 1, pause_s: float = 0.0) -> list[Result]:
    """One connection asking `turns` questions; a Result per turn begun. After each reply but the last it waits
    for the reply's playback to end, then `pause_s`. A turn with an error ends the session."""
    await asyncio.sleep(delay_s)
    results: list[Result] = []
    try:
        async with http.ws_connect(url, max_msg_size=0) as ws:
            await asyncio.wait_for(_converse(ws, chunks, system, turns, pause_s, results), timeout_s)
    except TimeoutError:
        _current(results).errors.append("timeout")
    except (aiohttp.ClientError, ConnectionError) as e:
        _current(results).errors.append(f"socket: {e!r}")
    for res in results:
        if res.ttfa_ms is None and not res.errors:
            res.errors.append("no audio")
    return results


def _current(results: list[Result]) -> Result:
    if not results:
        results.append(Result())
    return results[-1]


async def _converse(ws: aiohttp.ClientWebSocketResponse, chunks: list[str], system: str, turns: int,
                    pause_s: float, results: list[Result]) -> None:
    await ws.send_json({"type": "session.update", "session": {
        "type": "realtime", "instructions": system, "audio": {"input": {"turn_detection": None}}}})
    for turn in range(turns):
        res = Result()
        results.append(res)
        await _ask(ws, chunks, res)
        if res.errors or res.ttfa_ms is None or turn == turns - 1:
            return
        await asyncio.sleep(max(0.0, res.player.dry_at - time.perf_counter()) + pause_s)  # after response.done


async def _ask(ws: aiohttp.ClientWebSocketResponse, chunks: list[str], res: Result) -> None:
    """Streams the question in real time, commits, asks for a response and reads it to response.done."""
    committed = asyncio.get_running_loop().create_future()
    reader = asyncio.create_task(_read(ws, committed, res))
    try:
        t0 = res.asked_at = time.perf_counter()
        for i, chunk in enumerate(chunks):
            if reader.done():
                break
            await asyncio.sleep(max(0.0, t0 + i * APPEND_S - time.perf_counter()))
            res.append_late_ms = max(res.append_late_ms, (time.perf_counter() - t0 - i * APPEND_S) * 1e3)
            await ws.send_json({"type": "input_audio_buffer.append", "audio": chunk})
        if not reader.done():
            committed.set_result(time.perf_counter())
            await ws.send_json({"type": "input_audio_buffer.commit"})
            await ws.send_json({"type": "response.create"})
    except ConnectionError as e:
        res.errors.append(f"socket: {e!r}")
        await ws.close()
    await reader


async def _read(ws: aiohttp.ClientWebSocketResponse, committed: asyncio.Future, res: Result) -> None:
    """Events until response.done (or the socket closes), playing the audio on a simulated clock."""
    player = res.player
    while True:
        msg = await ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            res.errors.append(f"socket closed before response.done: {msg.type.name} {ws.close_code}")
            return
        ev, now = json.loads(msg.data), time.perf_counter()
        kind = ev.get("type")
        if kind == "error":
            res.errors.append(f"error event: {ev.get('error', {}).get('code')}: {ev.get('error', {}).get('message')}")
        elif kind == "response.output_audio.delta":
            if player.samples == 0:
                res.ttfa_ms = (now - committed.result()) * 1e3
            player.feed(now, len(base64.b64decode(ev["delta"])) // 2)
        elif kind == "response.done":
            res.done_at, resp = now, ev["response"]
            if resp["status"] not in ("completed", "incomplete"):
                res.errors.append(f"response {resp['status']}: {resp.get('status_details')}")
            usage = resp.get("usage") or {}
            res.text_tokens = usage.get("output_token_details", {}).get("text_tokens", 0)
            res.frames = usage.get("output_token_details", {}).get("audio_tokens", 0)
            if player.samples:
                res.rtf = (now - committed.result()) / (player.samples / 24000)
            return


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def measured(r: Result) -> bool:
    return r.ttfa_ms is not None and r.rtf is not None


def cpu_model() -> str:
    """The host CPU's model name (Linux's /proc/cpuinfo), else its architecture."""
    try:
        names = [x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                 if x.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.machine()


def _gpu(args: argparse.Namespace) -> dict:
    """The GPU's peak memory, and the host's load over the last minute (the same code's runs vary between device
    calls more than between settings: this says whether the host was busy)."""
    host = {"host_loadavg_1m": round(os.getloadavg()[0], 2)}
    if not (torch.cuda.is_available() and args.device.startswith("cuda")):
        return host
    return host | {"gpu_max_allocated_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "gpu_max_reserved_GiB": round(torch.cuda.max_memory_reserved() / 2**30, 2)}


def summary(results: list[Result], args: argparse.Namespace) -> dict:
    """The burst: one turn per session."""
    ok = [r for r in results if measured(r)]
    ttfa, rtf = [r.ttfa_ms for r in ok], [r.rtf for r in ok]
    out = {"sessions": len(results), "measured": len(ok), "errors": sum(len(r.errors) for r in results),
           "sessions_with_errors": sum(1 for r in results if r.errors),
           "error_samples": sorted({e for r in results for e in r.errors})[:5]}
    if ok:
        out.update({f"ttfa_ms_p{q}": round(pct(ttfa, q), 1) for q in (50, 95, 99)})
        out.update(rtf_median=round(statistics.median(rtf), 3), rtf_max=round(max(rtf), 3),
                   audio_s_median=round(statistics.median(r.player.samples / 24000 for r in ok), 3))
    out.update(underrun_sessions=sum(1 for r in results if r.player.underruns),
               underrun_events=sum(r.player.underruns for r in results),
               underrun_ms=round(sum(r.player.starved_s for r in results) * 1e3, 1),
               **short_replies(ok, args),
               append_late_ms_max=round(max(r.append_late_ms for r in results), 1))
    out.update(_gpu(args))
    return out


def short_replies(ok: list[Result], args: argparse.Namespace) -> dict:
    """Replies that ended before the server's limits (EOS on random weights): in all, by which limit they fell
    short of, and the short ones' codec frames (median)."""
    short = [r for r in ok if r.text_tokens < args.text_tokens or r.frames < args.frames]
    return {"short_replies": len(short), "short_text": sum(1 for r in short if r.text_tokens < args.text_tokens),
            "short_frames": sum(1 for r in short if r.frames < args.frames),
            "short_frames_median": statistics.median(r.frames for r in short) if short else None}


def conversation_summary(sessions: list[list[Result]], args: argparse.Namespace) -> dict:
    """Conversations: TTFA over every turn and over first turns; underruns and starved time per turn."""
    turns = [r for s in sessions for r in s]
    ok = [r for r in turns if measured(r)]
    first = [s[0].ttfa_ms for s in sessions if s and measured(s[0])]
    audio_s = sum(r.player.samples for r in turns) / 24000
    starved_s = sum(r.player.starved_s for r in turns)
    out = {"sessions": len(sessions), "turns": len(sessions) * args.turns, "turns_measured": len(ok),
           "sessions_completed": sum(1 for s in sessions if len(s) == args.turns and all(
               measured(r) and not r.errors for r in s)),
           "errors": sum(len(r.errors) for r in turns),
           "sessions_with_errors": sum(1 for s in sessions if any(r.errors for r in s)),
           "error_samples": sorted({e for r in turns for e in r.errors})[:5]}
    if ok:
        out.update({f"ttfa_ms_p{q}": round(pct([r.ttfa_ms for r in ok], q), 1) for q in (50, 95)})
        out.update(rtf_median=round(statistics.median(r.rtf for r in ok), 3), rtf_max=round(max(r.rtf for r in ok), 3))
    if first:
        out.update({f"first_turn_ttfa_ms_p{q}": round(pct(first, q), 1) for q in (50, 95)})
    out.update(underrun_turns=sum(1 for r in turns if r.player.underruns),
               underrun_events=sum(r.player.underruns for r in turns), audio_s=round(audio_s, 2),
               starved_s=round(starved_s, 2), starved_fraction=round(starved_s / audio_s, 4) if audio_s else None,
               **short_replies(ok, args),
               append_late_ms_max=round(max((r.append_late_ms for r in turns), default=0.0), 1))
    gaps = [b.asked_at - max(a.player.dry_at, a.done_at) for s in sessions for a, b in itertools.pairwise(s)]
    if gaps:  # the reply's end (playback and response.done) -> the next question: --pause-s unless the client lags
        out.update(pause_s_min=round(min(gaps), 3), pause_s_max=round(max(gaps), 3))
    out.update(_gpu(args))
    return out


async def run_levels(pipeline: Pipeline, args: argparse.Namespace, levels: list[int], header: dict) -> list[dict]:
    limits = Limits(max_text_tokens=args.text_tokens, max_frames=args.frames, encode_ahead=not args.no_encode_ahead,
                    ignore_eos=not args.eos)
    server = Server(pipeline, ServerConfig(max_sessions=max(levels) + 1, max_sessions_per_client=max(levels) + 1,
                                           limits=limits, gil_switch_ms=args.gil_switch_ms[0]))
    server_ttfa: list[float] = []  # the server's own time to first audio (its histogram's observations), seconds
    timings: list[dict[str, float]] = []  # each ended response's engine milestones (TurnDone.timings)
    commit_input: list[float] = []  # from each commit to its audio encoded (omni_commit_input_seconds), seconds
    observe, record = server.metrics.ttfa.observe, server.metrics.turn_timings
    observe_input = server.metrics.commit_input.observe
    server.metrics.ttfa.observe = lambda s: (server_ttfa.append(s), observe(s))[-1]
    server.metrics.commit_input.observe = lambda s: (commit_input.append(s), observe_input(s))[-1]
    server.metrics.turn_timings = lambda t: (timings.append(t), record(t))[-1]
    handoff, rounds = timed_handoff(pipeline), timed_rounds(pipeline)
    timeline = GpuTimeline(pipeline, lambda: len(rounds)) if args.trace_s else None
    lags: list[float] = []
    if not args.no_gc_freeze:
        freeze_loaded()  # as serve does once the model is loaded
    gc_log = GcPauses()
    gc.callbacks.append(gc_log)
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"ws://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/realtime?model=qwen3-omni"
    pcm = resample(speech_like(args.audio_seconds), 16000, 24000)
    step = int(24000 * APPEND_S)
    chunks = [base64.b64encode((pcm[i : i + step].clamp(-1, 1) * 32767).to(torch.int16).numpy().tobytes()).decode()
              for i in range(0, len(pcm), step)]
    system = " word" * args.system_tokens
    spawn = multiprocessing.get_context("spawn")
    procs = args.client_processes
    pool = None if args.clients_in_process else ProcessPoolExecutor(procs, mp_context=spawn)

    async def clients(n: int, spread_s: float, turns: int, pause_s: float, timeout_s: float) -> list[list[Result]]:
        run = (url, chunks, system, n, spread_s, timeout_s, turns, pause_s, time.time() + 0.1)
        if pool is None:
            return await _clients(*run, range(n))
        loop = asyncio.get_running_loop()
        parts = [range(k, n, procs) for k in range(min(procs, n))]  # session i in process i % procs
        done = await asyncio.gather(*(loop.run_in_executor(pool, _clients_process, *run, part) for part in parts))
        return [done[i % procs][i // procs] for i in range(n)]

    lines = []
    try:
        if pool is not None:  # every client process started (and its imports done) before any level's clock runs
            await asyncio.gather(*(asyncio.get_running_loop().run_in_executor(pool, time.sleep, 1.0)
                                   for _ in range(procs)))
        warm = (await clients(1, 0.0, 1, 0.0, args.timeout_s))[0][0]
        if warm.errors:
            raise RuntimeError(f"warm-up session failed: {warm.errors}")
        for i, n in enumerate(levels):
            policy = pipeline.request(lambda i=i: set_policy(pipeline, args, i)).result(30)
            policy["audio_workers"] = audio_workers(server, args, i)
            if torch.cuda.is_available() and args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            before = engine(pipeline)
            server_ttfa.clear()
            commit_input.clear()
            timings.clear()
            handoff.clear()
            lags.clear()
            rounds.clear()
            gc_log.pauses.clear()
            compiled = triton_kernels()
            probe = asyncio.create_task(loop_lag(lags))
            traced = args.trace_s and args.trace_s[i % len(args.trace_s)] > 0
            trace = asyncio.create_task(trace_window(timeline, args, i)) if traced else None
            sessions = await clients(n, args.spread_s, args.turns, args.pause_s, args.timeout_s)
            probe.cancel()
            line = {**header, **policy, "bench": "load", "audio_seconds": args.audio_seconds,
                    "text_tokens": args.text_tokens, "frames": args.frames, "spread_s": args.spread_s,
                    "eos": args.eos}
            line["engine"] = engine_delta(before, engine(pipeline))
            line["engine"]["milestone_ms_p50_p95"] = milestone_gaps(timings)
            line["engine"]["longest_rounds"] = [r.summary() for r in sorted(rounds, key=lambda r: r.s)[-3:][::-1]]
            if rounds:
                line["engine"]["round_ms_p50_p95"] = [round(pct([r.s for r in rounds], q) * 1e3, 1) for q in (50, 95)]
            line["gc"] = gc_summary(gc_log.pauses)
            if compiled is not None:
                line["triton_compiled"] = triton_kernels() - compiled
            if trace is not None:
                line["gpu_trace"] = await trace
            # from the commit's arrival to the first delta handed to the socket, and its first part: the commit's
            # audio resampled and encoded on an audio worker
            # then the engine's command queue (a turn is taken between rounds of the stages); the server's event
            # loop's lateness (a timer's, sampled every LAG_PROBE_S) is what each hop through it may wait
            for key, seconds in (("server_ttfa", server_ttfa), ("commit_input", commit_input), ("handoff", handoff),
                                 ("loop_lag", lags)):
                if seconds:
                    line[f"{key}_ms_p50_p95"] = [round(pct(seconds, q) * 1e3, 1) for q in (50, 95)]
            if args.turns == 1:
                line.update(summary([s[0] for s in sessions], args))
            else:
                line.update(mode="conversation", turns_per_session=args.turns, pause_s=args.pause_s,
                            **conversation_summary(sessions, args))
            print(json.dumps(line), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(line) + "\n")
            lines.append(line)
    finally:
        gc.callbacks.remove(gc_log)
        gc.unfreeze()  # this process may go on (a test's)
        if pool is not None:
            pool.shutdown()
        await runner.cleanup()
    return lines


def timed_handoff(pipeline: Pipeline) -> list[float]:
    """Seconds from each Pipeline.submit to the engine thread starting that turn, appended to the list returned."""
    handoff: list[float] = []
    submitted: dict[str, float] = {}
    submit, start_turn = pipeline.submit, pipeline.program.start_turn

    def submit_timed(turn: Turn, held: bool = False) -> Any:
        submitted[turn.turn_id] = time.perf_counter()
        return submit(turn, held)

    def start_timed(turn: Turn, *args: Any) -> None:
        at = submitted.pop(turn.turn_id, None)
        if at is not None:
            handoff.append(time.perf_counter() - at)
        start_turn(turn, *args)

    pipeline.submit, pipeline.program.start_turn = submit_timed, start_timed
    return handoff


@dataclass
class Round:
    """One engine iteration: its seconds, and per stage the host ms of its launch and finish and the prefill tokens
    (new inputs of its prefill batches) it ran."""

    s: float = 0.0
    stages: dict[str, list[float]] = field(default_factory=dict)  # name -> [ms, prefill tokens]
    ran: bool = False  # a stage ran a batch (else the engine waited for commands)

    def summary(self) -> dict:
        return {"ms": round(self.s * 1e3, 1),
                "stages": {k: [round(ms, 1), int(tokens)] for k, (ms, tokens) in self.stages.items()}}


def timed_rounds(pipeline: Pipeline) -> list[Round]:
    """Each engine iteration that ran a batch (commands, admission, one round of the stages) as a Round, appended
    to the list returned: a stall shows as one long round, and its stages say where."""
    rounds: list[Round] = []
    now = Round()
    iterate = pipeline._iterate

    def timed() -> None:
        nonlocal now
        now, start = Round(), time.perf_counter()
        try:
            iterate()
        finally:
            now.s = time.perf_counter() - start
            if now.ran:
                rounds.append(now)

    def part(stage: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                now.stages.setdefault(stage.name, [0.0, 0])[0] += (time.perf_counter() - start) * 1e3

        return call

    def counted(stage: Any, run: Callable[..., Any]) -> Callable[..., Any]:
        def call(batch: Any) -> Any:
            now.ran = True
            if batch.prefill:
                now.stages.setdefault(stage.name, [0.0, 0])[1] += sum(batch.lengths)
            return run(batch)

        return call

    pipeline._iterate = timed
    for stage in pipeline.stages:
        stage.launch, stage.finish = part(stage, stage.launch), part(stage, stage.finish)
        stage.runner.run = counted(stage, stage.runner.run)
    return rounds


@dataclass
class GcPauses:
    """(generation, seconds) of each garbage collection while it is in gc.callbacks: the collector runs in
    whichever thread triggers it, holding the GIL, so every thread of the server waits."""

    pauses: list[tuple[int, float]] = field(default_factory=list)
    began: float = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.began = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self.began))


def gc_summary(pauses: list[tuple[int, float]]) -> dict:
    """Collections a generation, and the ms of the longest and of all."""
    return {"collections": [sum(1 for g, _ in pauses if g == gen) for gen in range(3)],
            "ms_max": round(max((s for _, s in pauses), default=0.0) * 1e3, 1),
            "ms_total": round(sum(s for _, s in pauses) * 1e3, 1),
            "full_ms_max": round(max((s for g, s in pauses if g == 2), default=0.0) * 1e3, 1)}


def triton_kernels() -> int | None:
    """Kernels in Triton's cache (TRITON_CACHE_DIR, where set): what a level adds, it compiled while serving."""
    folder = os.environ.get("TRITON_CACHE_DIR")
    return len(os.listdir(folder)) if folder and os.path.isdir(folder) else None


LAG_PROBE_S = 0.005


async def loop_lag(lags: list[float]) -> None:
    """How late a timer on this event loop fires, every LAG_PROBE_S, until cancelled."""
    while True:
        start = time.perf_counter()
        await asyncio.sleep(LAG_PROBE_S)
        lags.append(time.perf_counter() - start - LAG_PROBE_S)


async def trace_window(timeline: GpuTimeline, args: argparse.Namespace, level: int) -> dict:
    """The GPU's timeline (benchmarks/gpu_trace.py) from --trace-at to --trace-at + --trace-s into the level."""
    at, seconds = (xs[level % len(xs)] for xs in (args.trace_at, args.trace_s))
    await asyncio.sleep(at)
    timeline.on = True
    try:
        await asyncio.sleep(seconds)
    finally:
        timeline.on = False
    spans = await asyncio.get_running_loop().run_in_executor(None, timeline.take)
    return {"at_s": at, "seconds": seconds, **summarize(spans)}


def audio_workers(server: Server, args: argparse.Namespace, level: int) -> int:
    """The level's audio worker threads (--audio-workers cycles; else the server's): the sessions it opens take
    a pool of that many (the last level's pool ends once its jobs have)."""
    if args.audio_workers:
        n = args.audio_workers[level % len(args.audio_workers)]
        if n != server.audio._max_workers:
            server.audio.shutdown(wait=False)
            server.audio = AudioWorkers(n)
    return server.audio._max_workers


PREFILL_STAGES = ("thinker", "talker")  # the stages --decode-after-prefill and --prefill-tokens set
SEAL = AudioStream.seal  # the commit's host encoding on the audio worker (--seal 0: on the engine thread)
EAGER_S = InputStream.EAGER_S  # the server's; --eager-input-s changes it for this process's server


def set_policy(pipeline: Pipeline, args: argparse.Namespace, level: int) -> dict:
    """The scheduling policy of the `level`-th level (each given flag's list cycles; the others keep the
    server's), set on the engine thread; returns the talker's and admission's values as they now are."""
    def pick(values: list | None) -> object:
        return None if values is None else values[level % len(values)]

    urgent, after, fed, seal = pick(args.urgent_s), pick(args.decode_after_prefill), pick(args.fed_s), pick(args.seal)
    eager, switch_ms, settle = pick(args.eager_input_s), pick(args.gil_switch_ms), pick(args.settle_s)
    budget = pick(args.prefill_tokens)
    sys.setswitchinterval(switch_ms / 1000)  # process-wide, as the server sets it
    program = pipeline.program
    if seal is not None:  # the server is in this process: its audio workers call the class's seal
        AudioStream.seal = SEAL if seal else lambda self: None
    if eager is not None:  # read by its sessions at each append
        InputStream.EAGER_S = eager
    for stage in program.stages:
        if after is not None and stage.name in PREFILL_STAGES:
            stage.cfg = dataclasses.replace(stage.cfg, decode_after_prefill=after)
        stage.scheduler.urgent_s = stage.cfg.urgent_s if urgent is None else urgent
        if budget is not None and stage.name in PREFILL_STAGES:
            stage.scheduler.max_prefill_tokens = budget
    if fed is not None:
        program.admission.fed_s = fed
    if settle is not None:
        program.admission.settle_s = settle
    talker = program.by_name.get("talker") or program.by_name["thinker"]
    return {"urgent_s": talker.scheduler.urgent_s, "decode_after_prefill": talker.cfg.decode_after_prefill,
            "fed_s": program.admission.fed_s, "settle_s": program.admission.settle_s, "seal": AudioStream.seal is SEAL,
            "eager_input_s": InputStream.EAGER_S, "prefill_tokens": talker.scheduler.max_prefill_tokens,
            "gil_switch_ms": switch_ms}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _flags(text: str) -> list[bool]:
    if not set(text.split(",")) <= {"0", "1"}:
        raise ValueError(text)
    return [x == "1" for x in text.split(",")]


async def _clients(url: str, chunks: list[str], system: str, n: int, spread_s: float, timeout_s: float, turns: int,
                   pause_s: float, start_at: float, which: range) -> list[list[Result]]:
    """Sessions `which` of a level's N, session i starting i * spread_s / N after `start_at` (time.time(): one
    clock for every client process)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        return list(await asyncio.gather(*(session(http, url, chunks, system,
                                                   max(0.0, start_at + i * spread_s / n - time.time()), timeout_s,
                                                   turns, pause_s) for i in which)))


def _clients_process(*run: object) -> list[list[Result]]:
    return asyncio.run(_clients(*run))  # type: ignore[arg-type]


def engine(pipeline: Pipeline) -> dict:
    """The engine's running totals: per stage (steps, rows, busy seconds), and the admission counters."""
    def read() -> dict:
        return {"stages": {s.name: (s.runner.steps, s.runner.rows, s.runner.busy_s) for s in pipeline.stages},
                **pipeline.program.admission.counters()}
    return pipeline.request(read).result(60)


MILESTONES = ("admitted_ms", "prompt_ms", "first_text_ms", "first_frame_ms", "first_audio_ms")


def milestone_gaps(timings: list[dict[str, float]]) -> dict[str, list[float]]:
    """Where the engine's time to first audio went: per step from the turn's start to its first audio (admission,
    the prompt's encoding, the first reply token, the first codec frame, its audio), p50 and p95 in ms."""
    gaps: dict[str, list[float]] = {}
    for t in timings:
        if "first_audio_ms" not in t:
            continue
        last = 0.0
        for name in MILESTONES:
            if name in t:
                gaps.setdefault(name.removesuffix("_ms"), []).append(t[name] - last)
                last = t[name]
        gaps.setdefault("engine_total", []).append(t["first_audio_ms"])
    return {name: [round(pct(xs, 50), 1), round(pct(xs, 95), 1)] for name, xs in gaps.items()}


def engine_delta(a: dict, b: dict) -> dict:
    """What one level did: per stage, batches run, mean rows per batch and mean ms per batch; turns that waited
    at admission and how long in all."""
    stages = {}
    for name, (steps, rows, busy) in b["stages"].items():
        s0, r0, b0 = a["stages"][name]
        n = steps - s0
        stages[name] = {"steps": n, "rows_per_step": round((rows - r0) / n, 2) if n else None,
                        "ms_per_step": round((busy - b0) * 1e3 / n, 2) if n else None}
    return {"stages": stages, "turns_waited": b["turns_waited"] - a["turns_waited"],
            "admission_wait_s": round(b["admission_wait_s"] - a["admission_wait_s"], 3)}


def random_voice(device: str, dtype: str | None) -> object:
    """Qwen3-TTS 12Hz-1.7B-CustomVoice's sizes (the speech tokenizer's decoder: the reference config class's
    defaults) with seeded random weights made on `device`, as the voice of the replies."""
    from models.common.tokenizer import Tokenizer
    from models.common.weights import random_weights_
    from models.qwen3_tts.codec import DECODER_DEFAULTS, CodecDecoderConfig, build_decoder
    from models.qwen3_tts.config import TtsConfig
    from models.qwen3_tts.model import Qwen3Tts
    from models.qwen3_tts.program import TtsPipelineConfig
    from models.qwen3_tts.spec import DEFAULTS, Generation
    from models.qwen3_tts.tiny import tiny_config
    from models.qwen3_tts.voice import TtsVoice

    dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    cfg = tiny_config("custom_voice")
    sizes = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, text_hidden_size=2048,
                 rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"})
    cfg["talker_config"].update(sizes)
    cfg["talker_config"]["code_predictor_config"].update(hidden_size=1024, intermediate_size=3072,
                                                         num_hidden_layers=5, num_attention_heads=16,
                                                         num_key_value_heads=8, head_dim=128)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device("meta"):
            net = Qwen3Tts(TtsConfig.from_hf(cfg), build_decoder(CodecDecoderConfig.from_hf(
                {**DECODER_DEFAULTS, "codebook_dim": 512})))
    finally:
        torch.set_default_dtype(default)
    net = net.to_empty(device=device)
    random_weights_(net)
    net.eval().requires_grad_(False)
    pcfg = TtsPipelineConfig.on("random-weights", device, dtype, talker={"kv_blocks": 1024})
    return TtsVoice(net, Tokenizer.builtin(), Generation.read(DEFAULTS), pcfg)


def table(lines: list[dict]) -> str:
    cols = ["sessions", "errors", "ttfa_ms_p50", "ttfa_ms_p95", "ttfa_ms_p99", "rtf_median", "rtf_max",
            "underrun_sessions", "underrun_ms"]
    if lines and lines[0].get("mode") == "conversation":
        cols = ["sessions", "turns", "errors", "ttfa_ms_p50", "ttfa_ms_p95", "first_turn_ttfa_ms_p50",
                "first_turn_ttfa_ms_p95", "rtf_max", "underrun_turns", "starved_s", "starved_fraction"]
    rows = [cols] + [[str(line.get(c, "-")) for c in cols] for line in lines]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="tiny random model instead of full size")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--sessions", default="1,8,32,64", help="comma-separated numbers of concurrent sessions")
    ap.add_argument("--audio-seconds", type=float, default=3.0)
    ap.add_argument("--system-tokens", type=int, default=32)
    ap.add_argument("--text-tokens", type=int, default=16, help="server limit on reply text tokens")
    ap.add_argument("--frames", type=int, default=25, help="server limit on reply codec frames (80 ms each)")
    ap.add_argument("--eos", action="store_true",
                    help="replies may end at EOS (default: each runs to --text-tokens and --frames; on random weights "
                         "every session's identical turns end alike, so EOS makes the load depend on one draw)")
    ap.add_argument("--spread-s", type=float, default=1.0, help="session starts are spread evenly over this")
    ap.add_argument("--turns", type=int, default=1,
                    help="questions per session; above 1 the conversation mode (replies played out, then a pause)")
    ap.add_argument("--pause-s", type=float, default=1.0,
                    help="conversation mode: pause after a reply's playback ends before the next question")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="a session taking longer is an error")
    ap.add_argument("--out", help="append the JSON lines to this file")
    ap.add_argument("--voice-model", nargs="?", const="random", default="",
                    help="a Qwen3-TTS voice speaks (no value: random weights, 1.7B or tiny; or a checkpoint directory)")
    ap.add_argument("--play-ahead-s", type=float, default=0.0,
                    help="serve --play-ahead-s: a reply that far ahead of its playback waits (default 0: off)")
    ap.add_argument("--quantization", choices=["fp8"], help="fp8: the MoE experts kept in fp8 (serve's flag)")
    ap.add_argument("--gpu-memory-gib", type=float, help="serve --gpu-memory-gib: the process takes at most this "
                    "much of the GPU, and the KV caches what it leaves")
    ap.add_argument("--no-triton", nargs="?", const="all", default="", metavar="KERNELS",
                    help="serve --no-triton: torch's kernels, not ours; or only those named, comma-separated, of "
                         + ", ".join(SWITCHES) + " (a bisection)")
    ap.add_argument("--no-overlap", action="store_true",
                    help="the thinker's decode runs before the talker's, not beside it (StageConfig.overlap off)")
    ap.add_argument("--gil-switch-ms", type=_floats, default=[ServerConfig.gil_switch_ms],
                    help=f"serve --gil-switch-ms (default {ServerConfig.gil_switch_ms}; Python's own: 5); a "
                         "comma-separated list cycles over the levels, as --urgent-s does")
    ap.add_argument("--threads", type=int,
                    help="torch CPU threads, as serve --threads (default: serve's, 1 on CUDA, min(4, cores) on CPU; "
                         "before 2026-12-02's seventh session the benchmark left torch's own, one per core)")
    ap.add_argument("--clients-in-process", action="store_true",
                    help="run the clients in the server's process (as before 2026-12-02's third session), not a child")
    ap.add_argument("--client-processes", type=int, default=4,
                    help="child processes the clients are spread over (default 4; one, as in 2026-12-02's third and "
                         "fourth sessions, lagged: its appends ran up to 128 ms late at 128 sessions)")
    ap.add_argument("--urgent-s", type=_floats,
                    help="a stream with less audio buffered holds its stage's prefills back (the server's: "
                         f"{URGENT_S}, 0 in a stage with decode_after_prefill); a comma-separated list cycles over "
                         "the levels (an A/B in one process)")
    ap.add_argument("--decode-after-prefill", type=_flags,
                    help="1 (the server's): the thinker's and talker's launches that prefill new turns also decode "
                         "the playing streams (StageConfig.decode_after_prefill); 0: not. A comma-separated list "
                         "of 0/1 cycles over the levels, as --urgent-s does")
    ap.add_argument("--seal", type=_flags,
                    help="1 (the server's): the audio worker runs the commit's host encoding as it hands the turn "
                         "its audio (AudioAhead.seal); 0: the engine's encoder step runs it, as before. A "
                         "comma-separated list of 0/1 cycles over the levels, as --urgent-s does")
    ap.add_argument("--eager-input-s", type=_floats,
                    help=f"while the audio workers are idle, a session's appends go on to them once this much has "
                         f"gathered (the server's: {EAGER_S}; 0: only every {InputStream.BATCH_S} s); a "
                         "comma-separated list cycles over the levels, as --urgent-s does")
    ap.add_argument("--stream-batch", type=int,
                    help="the talker's and Code2Wav's most rows a step (the server's: 64); more captures a bucket "
                         "of that size, so no playing stream waits a round for a row")
    ap.add_argument("--audio-workers", type=_ints,
                    help="the server's audio worker threads (ServerConfig.audio_workers; default 2), which decode "
                         "appends and encode the input ahead and at the commit; a comma-separated list cycles over "
                         "the levels")
    ap.add_argument("--prefill-tokens", type=_ints,
                    help="the thinker's and talker's prefill token budget a step (StageConfig.max_prefill_tokens; the "
                         "server's: 8192); a comma-separated list cycles over the levels")
    ap.add_argument("--fed-s", type=_floats,
                    help=f"a new turn waits while a playing stream has less audio buffered (the server's: {FED_S}; "
                         "0: never); a comma-separated list cycles over the levels, as --urgent-s does")
    ap.add_argument("--trace-s", type=_floats,
                    help="CUDA only: time each stage's batches on the GPU (CUDA events) for this many seconds of "
                         "each level, from --trace-at into it, and add each stage's GPU time, the GPU's idle gaps "
                         "and the longest rounds' GPU time by stage to the level's line (gpu_trace; "
                         "benchmarks/gpu_trace.py); a comma-separated list cycles over the levels (0: none). Two "
                         "events a batch cost some host time: a traced level's other numbers are not comparable")
    ap.add_argument("--trace-at", type=_floats, default=[0.0],
                    help="seconds into each level the --trace-s window starts (default 0; a list cycles); the clients "
                         "speak for --audio-seconds first, so the engine's rounds start about then")
    ap.add_argument("--settle-s", type=_floats,
                    help=f"a stream that began playing less than this ago does not hold new turns back (the "
                         f"server's: {SETTLE_S}); a comma-separated list cycles over the levels, as --urgent-s does")
    ap.add_argument("--fp8-wide-rows", type=int, default=fp8_moe.PREFILL_ROWS,
                    help=f"the fp8 expert kernel's wide tiles (prefills) from this many rows a call (fp8_moe."
                         f"PREFILL_ROWS, the server's: {fp8_moe.PREFILL_ROWS}); 0: never (the decode's tiles always)")
    ap.add_argument("--fp8-prefill-tiles", default=None,
                    help="the wide tiles themselves, TILE_M:TILE_N:TILE_K:warps:stages (fp8_moe.PREFILL, the "
                         f"server's: {':'.join(map(str, fp8_moe.PREFILL or ()))}), e.g. the fastest of bench_fp8.py "
                         "--prefill-tiles")
    ap.add_argument("--prefill-rows", type=int, default=PrefillGraphs.ROWS[-1],
                    help="the most sequences one captured prefill call holds (PrefillGraphs.ROWS[-1], the server's: "
                         f"{PrefillGraphs.ROWS[-1]}; a power of 2): a burst round's new turns in fewer calls")
    ap.add_argument("--prefill-contexts", type=_ints, default=list(PrefillGraphs.CONTEXTS),
                    help="the captured prefills' context buckets, comma-separated and rising (PrefillGraphs.CONTEXTS, "
                         f"the server's: {','.join(map(str, PrefillGraphs.CONTEXTS))}): how wide a new turn's "
                         "attention is")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="leave what was loaded in the collector's view (serve freezes it: realtime.server."
                         "freeze_loaded), to A/B its full collections' pauses (each level's gc field)")
    ap.add_argument("--no-encode-ahead", action="store_true",
                    help="serve --no-encode-ahead: the audio is encoded at the commit, not as it arrives")
    args = ap.parse_args(argv)
    try:
        levels = [int(x) for x in args.sessions.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        ap.error(f"--sessions must be comma-separated positive integers, not {args.sessions!r}")
    if args.audio_seconds < 0.2 or args.spread_s < 0 or args.text_tokens < 1 or args.frames < 1:
        ap.error("need --audio-seconds >= 0.2 (the server's minimum commit is 100 ms), --spread-s >= 0, "
                 "--text-tokens >= 1, --frames >= 1")
    if args.client_processes < 1 or min(args.urgent_s or [0]) < 0 or min(args.fed_s or [0]) < 0 or \
            min(args.eager_input_s or [0]) < 0 or (args.stream_batch is not None and args.stream_batch < 1) or \
            min(args.gil_switch_ms) <= 0 or min(args.settle_s or [0]) < 0:
        ap.error("need --client-processes >= 1, --urgent-s >= 0, --fed-s >= 0, --eager-input-s >= 0, "
                 "--stream-batch >= 1, --gil-switch-ms > 0 and --settle-s >= 0")
    if args.trace_s and (min(args.trace_s) < 0 or min(args.trace_at) < 0 or not args.device.startswith("cuda")):
        ap.error("--trace-s needs CUDA, values >= 0 and --trace-at >= 0")
    if args.threads is None:
        args.threads = default_threads(args.device)
    if args.threads < 1:
        ap.error("need --threads >= 1")
    if args.turns < 1 or args.pause_s < 0 or args.play_ahead_s < 0:
        ap.error("need --turns >= 1, --pause-s >= 0 and --play-ahead-s >= 0")
    triton_off = set(SWITCHES) if args.no_triton == "all" else set(filter(None, args.no_triton.split(",")))
    if triton_off - set(SWITCHES):
        ap.error(f"--no-triton: unknown kernels {sorted(triton_off - set(SWITCHES))}; known: {', '.join(SWITCHES)}")
    if args.prefill_rows < 1 or args.prefill_rows & (args.prefill_rows - 1):
        ap.error(f"--prefill-rows must be a power of 2, not {args.prefill_rows}")
    if min(args.prefill_contexts) < 1 or sorted(set(args.prefill_contexts)) != args.prefill_contexts:
        ap.error(f"--prefill-contexts must rise, each above 0, not {args.prefill_contexts}")
    try:
        tiles = tuple(int(v) for v in args.fp8_prefill_tiles.split(":")) if args.fp8_prefill_tiles else None
    except ValueError:
        tiles = ()
    if tiles is not None and (len(tiles) != 5 or min(tiles) < 1):
        ap.error(f"--fp8-prefill-tiles takes TILE_M:TILE_N:TILE_K:warps:stages, not {args.fp8_prefill_tiles!r}")
    if args.gpu_memory_gib is not None:
        cap(args.device, args.gpu_memory_gib)
    voice, tiny = None, False
    if args.voice_model:
        from models.qwen3_tts.voice import build_voice

        tiny = args.tiny and args.voice_model == "random"
        voice = random_voice(args.device, args.dtype) if args.voice_model == "random" and not args.tiny \
            else build_voice("tiny-tts" if tiny else args.voice_model, args.device, args.dtype)
    streams = {"max_batch": args.stream_batch} if args.stream_batch else {}
    wide, rows, contexts = (fp8_moe.PREFILL, fp8_moe.PREFILL_ROWS), PrefillGraphs.ROWS, PrefillGraphs.CONTEXTS
    PrefillGraphs.CONTEXTS = tuple(args.prefill_contexts)
    fp8_moe.PREFILL = None if args.fp8_wide_rows <= 0 else tiles or fp8_moe.PREFILL
    fp8_moe.PREFILL_ROWS = max(1, args.fp8_wide_rows)
    PrefillGraphs.ROWS = tuple(1 << i for i in range(args.prefill_rows.bit_length()))
    header, program = random_program(args.tiny, args.device, args.dtype, voice, args.quantization,
                                     thinker={"overlap": not args.no_overlap}, talker=streams, code2wav=streams)
    header["stream_batch"] = program.by_name["code2wav"].cfg.max_batch if "code2wav" in program.by_name else None
    header["thinker_overlap"] = not args.no_overlap
    header.update(fp8_wide_rows=args.fp8_wide_rows if fp8_moe.PREFILL else 0, gc_freeze=not args.no_gc_freeze,
                  fp8_prefill_tiles=list(fp8_moe.PREFILL or ()), prefill_rows=PrefillGraphs.ROWS[-1],
                  prefill_contexts=list(PrefillGraphs.CONTEXTS))
    header["triton"], header["triton_off"] = not triton_off, sorted(triton_off)
    header["voice_model"] = "tiny-tts" if args.voice_model and tiny else args.voice_model or "qwen3-omni talker"
    header["play_ahead_s"] = args.play_ahead_s
    header["encode_ahead"] = not args.no_encode_ahead
    header["gpu_memory_gib"] = args.gpu_memory_gib
    header["clients_in_process"] = args.clients_in_process
    header["client_processes"] = 0 if args.clients_in_process else args.client_processes
    threads, switch_s = torch.get_num_threads(), sys.getswitchinterval()
    torch.set_num_threads(args.threads)
    header["threads"] = args.threads
    header["host_cpu"], header["host_cores"] = cpu_model(), os.cpu_count()
    use_triton(False, triton_off)  # read at each forward: the captures at the pipeline's start take it
    try:
        with Pipeline(program) as pipeline:
            pipeline.play_ahead_s = args.play_ahead_s
            lines = asyncio.run(run_levels(pipeline, args, levels, header))
    finally:
        AudioStream.seal = SEAL  # --seal 0 switched it off for this process's server only
        use_triton(True)
        InputStream.EAGER_S = EAGER_S
        torch.set_num_threads(threads)
        sys.setswitchinterval(switch_s)
        (fp8_moe.PREFILL, fp8_moe.PREFILL_ROWS), PrefillGraphs.ROWS, PrefillGraphs.CONTEXTS = wide, rows, contexts
    print(table(lines), file=sys.stderr)
    return lines


if __name__ == "__main__":
    main()
