"""benchmarks/bench_load.py: the load benchmark runs through the real server with the tiny model on CPU.

The benchmark's own `main` runs in this process, as `python benchmarks/bench_load.py ARGS` would run it (the
benchmark always serves on loopback from within the process that runs it); what it prints is read back from
stdout and stderr."""

from __future__ import annotations

import argparse
import gc
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import bench_load
from benchmarks.bench_load import EAGER_S, SEAL, START_BUFFER_S, Player, main
from benchmarks.gpu_trace import Span, idle_gaps_ns, summarize, union_ns
from models.common import fp8_moe
from models.qwen3_omni.audio_stream import AudioStream
from pipelines.graphs import PrefillGraphs
from realtime.audio import InputStream


def test_four_sessions_through_the_real_server(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "load.jsonl"
    out.write_text('{"earlier": "line"}\n')  # --out appends
    main(["--tiny", "--device", "cpu", "--sessions", "4", "--audio-seconds", "1", "--text-tokens", "4", "--frames",
          "6", "--spread-s", "0.3", "--timeout-s", "60", "--out", str(out)])
    proc = capsys.readouterr()
    printed = [json.loads(x) for x in proc.out.splitlines() if x.startswith("{")]
    assert len(printed) == 1
    line = printed[0]
    assert [json.loads(x) for x in out.read_text().splitlines()] == [{"earlier": "line"}, line]
    assert line["errors"] == 0 and line["sessions_with_errors"] == 0, line["error_samples"]
    assert line["sessions"] == 4 and line["measured"] == 4
    for key in ("ttfa_ms_p50", "ttfa_ms_p95", "ttfa_ms_p99", "rtf_median", "rtf_max", "audio_s_median"):
        assert math.isfinite(line[key]) and line[key] > 0, key
    assert line["ttfa_ms_p50"] <= line["ttfa_ms_p95"] <= line["ttfa_ms_p99"]
    assert line["rtf_median"] <= line["rtf_max"]
    assert 0 < line["audio_s_median"] <= 6 * 0.08  # the server's max_frames limit holds
    for key in ("underrun_sessions", "underrun_events", "underrun_ms", "short_replies", "device", "torch",
                "dtype", "size", "params_B"):
        assert key in line, key
    assert line["host_cpu"] and line["host_cores"] >= 1 and line["host_loadavg_1m"] >= 0
    assert (line["size"], line["device"], line["dtype"]) == ("tiny", "cpu", "float32")
    assert (line["decode_after_prefill"], line["urgent_s"], line["fed_s"]) == (True, 0.0, 0.1)  # the server's
    assert line["gc_freeze"] and len(line["gc"]["collections"]) == 3  # the collector's pauses, as serve runs
    assert 0 <= line["gc"]["full_ms_max"] <= line["gc"]["ms_max"] <= line["gc"]["ms_total"]
    assert gc.get_freeze_count() == 0 and not any(isinstance(c, bench_load.GcPauses) for c in gc.callbacks)
    assert "ttfa_ms_p95" in proc.err  # the human table


def test_conversations_of_two_turns_through_the_real_server(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "conv.jsonl"
    main(["--tiny", "--device", "cpu", "--sessions", "2", "--turns", "2", "--audio-seconds", "0.5", "--text-tokens",
          "4", "--frames", "6", "--pause-s", "0.2", "--spread-s", "0.3", "--timeout-s", "60", "--out", str(out)])
    proc = capsys.readouterr()
    printed = [json.loads(x) for x in proc.out.splitlines() if x.startswith("{")]
    assert len(printed) == 1 and [json.loads(x) for x in out.read_text().splitlines()] == printed
    line = printed[0]
    assert (line["bench"], line["mode"], line["turns_per_session"], line["pause_s"]) == ("load", "conversation", 2, 0.2)
    assert line["errors"] == 0 and line["sessions_with_errors"] == 0, line["error_samples"]
    assert (line["sessions"], line["turns"], line["turns_measured"], line["sessions_completed"]) == (2, 4, 4, 2)
    for key in ("ttfa_ms_p50", "ttfa_ms_p95", "first_turn_ttfa_ms_p50", "first_turn_ttfa_ms_p95", "rtf_median",
                "rtf_max", "audio_s"):
        assert math.isfinite(line[key]) and line[key] > 0, key
    assert line["ttfa_ms_p50"] <= line["ttfa_ms_p95"]
    assert line["first_turn_ttfa_ms_p50"] <= line["first_turn_ttfa_ms_p95"]
    short = ("short_replies", "short_text", "short_frames", "short_frames_median")
    assert [line[k] for k in short] == [0, 0, 0, None]
    assert 0.2 <= line["pause_s_min"] <= line["pause_s_max"] < 0.5  # after each reply's playback ends
    assert 0 < line["audio_s"] <= 4 * 6 * 0.08 + 0.01  # four replies, each within the server's max_frames limit
    assert 0 <= line["underrun_turns"] <= 4 and line["underrun_events"] >= line["underrun_turns"]
    assert line["starved_fraction"] == pytest.approx(line["starved_s"] / line["audio_s"], abs=0.01)
    stages = line["engine"]["stages"]  # what the engine did at this level
    assert set(stages) == {"audio_encoder", "thinker", "talker", "code2wav"}
    assert all(v["steps"] > 0 and v["rows_per_step"] >= 1 and v["ms_per_step"] > 0 for v in stages.values())
    talker = stages["talker"]  # a row per frame, at least (rows_per_step is rounded to 0.01)
    assert talker["steps"] * (talker["rows_per_step"] + 0.005) >= 4 * 6
    gaps = line["engine"]["milestone_ms_p50_p95"]  # where the engine's time to first audio went, 4 turns
    assert set(gaps) == {"admitted", "prompt", "first_text", "first_frame", "first_audio", "engine_total"}
    assert all(0 <= p50 <= p95 for p50, p95 in gaps.values())
    server = line["server_ttfa_ms_p50_p95"]  # the server's own time: within the client's, more than the engine's
    assert gaps["engine_total"][0] <= server[0] <= line["ttfa_ms_p50"] and server[0] <= server[1]
    commit = line["commit_input_ms_p50_p95"]  # the server's first part: the commit's audio resampled and encoded
    assert 0 < commit[0] <= commit[1] and commit[0] < server[0]
    assert line["client_processes"] == 4  # two sessions: two of the four processes ran one each
    assert "first_turn_ttfa_ms_p95" in proc.err  # the human table


def test_the_policy_flags_cycle_over_the_levels(capsys: pytest.CaptureFixture) -> None:
    """Each given flag's list cycles over the levels; a stage's prefill gate follows its launch unless given."""
    threads, switch_s = torch.get_num_threads(), sys.getswitchinterval()
    lines = main(["--tiny", "--device", "cpu", "--sessions", "1,1,1", "--audio-seconds", "0.5", "--text-tokens", "2",
                  "--frames", "3", "--timeout-s", "60", "--decode-after-prefill", "1,0", "--fed-s", "0,0.1,0.2",
                  "--seal", "0,1,0", "--eager-input-s", "0,0.2", "--stream-batch", "3", "--clients-in-process",
                  "--threads", "1", "--gil-switch-ms", "0.5,0.1", "--fp8-wide-rows", "0", "--prefill-rows", "4",
                  "--prefill-contexts", "1024,4096"])
    policies = [(x["urgent_s"], x["decode_after_prefill"], x["fed_s"], x["seal"], x["eager_input_s"],
                 x["gil_switch_ms"]) for x in lines]
    assert policies == [(0.0, True, 0.0, False, 0.0, 0.5), (0.25, False, 0.1, True, 0.2, 0.1),
                        (0.0, True, 0.2, False, 0.0, 0.5)]
    assert AudioStream.seal is SEAL and InputStream.EAGER_S == EAGER_S  # the server's own once the benchmark is done
    assert all(x["fp8_wide_rows"] == 0 for x in lines) and fp8_moe.PREFILL and fp8_moe.PREFILL_ROWS == 3072
    assert all(x["prefill_rows"] == 4 for x in lines) and PrefillGraphs.ROWS == (1, 2, 4, 8, 16)
    assert all(x["prefill_contexts"] == [1024, 4096] for x in lines) and PrefillGraphs.CONTEXTS == (256, 1024, 4096)
    assert sys.getswitchinterval() == switch_s
    assert all(x["threads"] == 1 for x in lines) and torch.get_num_threads() == threads
    assert all(x["stream_batch"] == 3 for x in lines)
    assert all(x["errors"] == 0 and x["measured"] == 1 for x in lines)
    assert "ttfa_ms_p95" in capsys.readouterr().err


def test_player_counts_gaps_after_the_start_buffer() -> None:
    frame = 1920  # 80 ms at 24 kHz
    on_time = Player()
    for i in range(10):  # a frame every 80 ms keeps the 100 ms start buffer
        on_time.feed(i * 0.08, frame)
    assert (on_time.underruns, on_time.starved_s) == (0, 0.0)
    slow = Player()
    slow.feed(0.0, frame)  # plays 0.1 .. 0.18
    slow.feed(0.15, frame)  # in time: plays 0.18 .. 0.26
    slow.feed(0.30, frame)  # 40 ms late, then plays 0.30 .. 0.38
    slow.feed(0.35, frame)  # in time
    assert slow.underruns == 1 and slow.starved_s == pytest.approx(0.04)
    assert slow.samples == 4 * frame and slow.dry_at == pytest.approx(0.46)
    assert START_BUFFER_S == 0.1


@pytest.mark.parametrize("bad", [["--sessions", "0"], ["--sessions", "4,x"], ["--audio-seconds", "0"],
                                 ["--turns", "0"], ["--pause-s", "-1"], ["--client-processes", "0"],
                                 ["--urgent-s", "-0.1"], ["--urgent-s", "0.25,x"], ["--fed-s", "-1"],
                                 ["--decode-after-prefill", "0,2"], ["--seal", "yes"], ["--stream-batch", "0"],
                                 ["--eager-input-s", "-0.1"], ["--threads", "0"], ["--gil-switch-ms", "0.5,0"],
                                 ["--trace-s", "1"], ["--settle-s", "-1"],
                                 ["--no-triton", "norm,bogus"]])
def test_bad_flags_are_refused_before_building_a_model(bad: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--tiny", "--device", "cpu", *bad])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_the_commit_probe_times_each_commits_steps_in_order() -> None:
    """benchmarks/probe_commit.py, in a process of its own (it wraps the classes' methods): one line per commit, its
    steps in the order the commit runs them, inside the commit's own time; the bench's own line still comes."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "benchmarks/probe_commit.py", "--tiny", "--device", "cpu", "--sessions",
                           "1,1", "--audio-seconds", "1.05", "--text-tokens", "2", "--frames", "3", "--timeout-s",
                           "60", "--clients-in-process", "--buckets", "32,64,128,512"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [json.loads(x.split(" ", 1)[1]) for x in proc.stderr.splitlines() if x.startswith("commit_steps ")]
    assert len(steps) == 3, proc.stderr[-2000:]  # the warm-up session's and one a level
    for s in steps:
        assert s["arrive"] == 0 and list(s)[0] == "arrive" and list(s)[-1] == "done", s
        assert s["take0"] <= s["seal0"] <= s["seal1"] <= s["take1"] <= s["done"], s
        assert s["enc1"] <= s["seal0"]  # the last batch (before the take, or its rest within it) came first
    assert any(x.startswith("capture_s ") for x in proc.stderr.splitlines())
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 2 and all(x["errors"] == 0 and x["seal"] for x in lines)


def test_gpu_trace_times_stages_rounds_and_idle_gaps() -> None:
    """benchmarks/gpu_trace.py's arithmetic: a stage's busy time is the union of its spans; two stages at once count
    as overlap; gaps over IDLE_NS are idle; a round's extent runs from its first span's start to its last's end, and
    its stages' GPU ms and prefill tokens add up."""
    ms = 1_000_000
    spans = [Span("thinker", "prefill", 4, 900, 0, 0, 3 * ms), Span("thinker", "decode", 64, 64, 0, 2 * ms, 4 * ms),
             Span("talker", "prefill", 4, 600, 0, 3 * ms, 5 * ms),  # beside the decode for 1 ms
             Span("talker", "decode", 60, 60, 1, 6 * ms, 7 * ms)]  # after 1 ms of nothing: idle
    out = summarize(spans, top=2)
    assert out["spans"] == 4 and out["window_ms"] == 7.0
    thinker, talker = out["stages"]["thinker"], out["stages"]["talker"]
    assert (thinker["busy_ms"], thinker["busy_frac"]) == (4.0, round(4 / 7, 3))
    assert thinker["prefill"] == {"n": 1, "ms_p50_p95_max": [3.0, 3.0, 3.0], "tokens_p50": 900}
    assert thinker["decode"] == {"n": 1, "ms_p50_p95_max": [2.0, 2.0, 2.0], "rows_p50": 64}
    assert talker["busy_ms"] == 3.0 and "finish" not in talker
    assert out["busy_frac"] == round(6 / 7, 3) and out["overlap_ms"] == 1.0
    assert (out["idle_gaps"], out["idle_ms_total"], out["idle_ms_p50_p95_max"]) == (1, 1.0, [1.0, 1.0, 1.0])
    first, second = out["longest_rounds"]
    assert first == {"gpu_ms": 5.0, "busy_ms": 5.0, "stages": {"thinker": [5.0, 900], "talker": [2.0, 600]}}
    assert second == {"gpu_ms": 1.0, "busy_ms": 1.0, "stages": {"talker": [1.0, 0]}}
    assert union_ns([(0, 2), (1, 3), (5, 6)]) == 4 and idle_gaps_ns([(0, 2), (1, 3), (5, 6)]) == [2]
    assert summarize([]) == {"spans": 0}


def test_short_replies_say_which_limit_they_fell_short_of():
    args = argparse.Namespace(text_tokens=16, frames=75)
    replies = [SimpleNamespace(text_tokens=t, frames=f) for t, f in ((16, 75), (16, 13), (9, 75), (4, 30), (16, 40))]
    assert bench_load.short_replies(replies, args) == {"short_replies": 4, "short_text": 2, "short_frames": 3,
                                                       "short_frames_median": 35.0}


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_the_servers_ignore_eos_limit_reaches_every_reply(ignore_eos: bool) -> None:
    """Limits.ignore_eos (bench_load's default, off with --eos) goes into each reply's options through the real
    server and the SDK; the reply then runs to the limits."""
    import asyncio

    from models import registry
    from realtime.server import ServerConfig
    from realtime.session import Limits
    from tests.realtime_server import client, running, until

    limits = Limits(max_text_tokens=5, max_frames=4, ignore_eos=ignore_eos)
    with registry.build_pipeline("tiny") as pipeline, \
            running(pipeline, ServerConfig(model_name=pipeline.spec.name, limits=limits)) as (url, _):
        submitted, submit = [], pipeline.submit
        pipeline.submit = lambda turn, **kw: (submitted.append(turn.options), submit(turn, **kw))[-1]

        async def ask() -> dict:
            async with client(url).realtime.connect(model=pipeline.spec.name) as conn:
                await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                          "content": [{"type": "input_text", "text": "Hi"}]})
                await conn.response.create()
                return (await until(conn, "response.done"))["response"]

        response = asyncio.run(ask())
    assert [o.ignore_eos for o in submitted] == [ignore_eos]
    if ignore_eos:  # cut at the limit, every frame made
        assert response["status"] == "incomplete" and response["usage"]["output_token_details"]["audio_tokens"] == 4
