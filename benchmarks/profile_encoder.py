"""Where a commit's audio-encoder time goes with encode-ahead (AudioStream), at full size on one GPU.

For N streams of a 3 s speech-like question pushed half a second at a time (as realtime/audio.py's InputStream
does), the commit's parts as EncoderStep runs them: every stream's `finish_parts` (host log-mel tail, floor check,
tail chunk embedding), one `finish_all` (the tails' transformer call) and each turn's `embed_prompt`. Wall ms of
each part (CUDA synchronized), and for the largest N a torch.profiler table by self CPU time and one by CUDA time.

  python3 benchmarks/profile_encoder.py --streams 1,16,64 --out $OUT/encoder.json --table $OUT/encoder_profile.txt
  python3 benchmarks/profile_encoder.py --streams 1,16,64 --graphs   # and each commit through EncoderGraph
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_pipeline import print_line, speech_like  # noqa: E402
from models.qwen3_omni.audio_encoder import AudioEncoder  # noqa: E402
from models.qwen3_omni.audio_stream import AudioStream, finish_all  # noqa: E402
from models.qwen3_omni.config import AudioEncoderConfig  # noqa: E402
from models.qwen3_omni.encoder_graph import EncoderGraph  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config  # noqa: E402


def encoder(tiny: bool, device: str, dtype: torch.dtype) -> AudioEncoder:
    d = tiny_config("a") if tiny else json.loads(FULL_CONFIG.read_text())
    torch.manual_seed(0)
    enc = AudioEncoder(AudioEncoderConfig.from_hf(d["thinker_config"]["audio_config"]))
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.02)
    return enc.to(device, dtype).eval()


def streams(enc: AudioEncoder, n: int, seconds: float) -> tuple[list[AudioStream], float]:
    out, t0 = [], time.perf_counter()
    for i in range(n):
        audio, s = speech_like(seconds + 0.01 * i), AudioStream(enc)
        for lo in range(0, audio.numel(), 8000):
            s.push(audio[lo : lo + 8000])
        out.append(s)
    return out, (time.perf_counter() - t0) * 1e3 / n


def commit(enc: AudioEncoder, embed: torch.nn.Embedding, ss: list[AudioStream], sync,
           graph: EncoderGraph | None = None, outs_seen: list | None = None) -> dict:
    t0 = time.perf_counter()
    tails = [s.finish_parts()[1] for s in ss]
    sync()
    t1 = time.perf_counter()
    outs = finish_all(enc, tails, graph)
    if outs_seen is not None:
        outs_seen.append(outs)
    sync()
    t2 = time.perf_counter()
    for o in outs:  # the prompt's embeddings with the audio in place, as merge_audio does (it counts on the host)
        ids = torch.zeros(o.shape[0] + 40, dtype=torch.long, device=o.device)
        ids[20 : 20 + o.shape[0]] = 1
        x = embed(ids)
        mask = ids == 1
        int(mask.sum())
        x.masked_scatter(mask[:, None], o.to(x.dtype))
    sync()
    t3 = time.perf_counter()
    return {"finish_parts_ms": (t1 - t0) * 1e3, "finish_all_ms": (t2 - t1) * 1e3, "embed_ms": (t3 - t2) * 1e3,
            "total_ms": (t3 - t0) * 1e3, "per_turn_ms": (t3 - t0) * 1e3 / len(ss)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", default="1,16,64")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out")
    ap.add_argument("--table", help="write the profiler tables of the largest N here")
    ap.add_argument("--graphs", action="store_true",
                    help="also each commit through EncoderGraph (CUDA graphs per window count on a GPU)")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    enc = encoder(args.tiny, args.device, dtype)
    embed = torch.nn.Embedding(8, enc.cfg.output_dim, device=args.device, dtype=dtype)
    res: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "seconds": args.seconds}
    with torch.inference_mode():
        commit(enc, embed, streams(enc, 2, args.seconds)[0], sync)  # warm-up
        ns = [int(x) for x in args.streams.split(",")]
        graph = None
        if args.graphs:  # the same commits through EncoderGraph's CUDA graphs, and how far their outputs are
            graph = EncoderGraph(enc, dtype, torch.device(args.device), graphs=cuda)
            t0 = time.perf_counter()
            graph.capture(None)
            res["graph_capture_s"] = time.perf_counter() - t0
            commit(enc, embed, streams(enc, 2, args.seconds)[0], sync, graph)
        for n in ns:
            outs: list = []
            ss, push_ms = streams(enc, n, args.seconds)
            res[f"N{n}"] = {"push_ms_per_stream": push_ms, **commit(enc, embed, ss, sync, None, outs)}
            if graph is not None:
                res[f"N{n}_graph"] = commit(enc, embed, streams(enc, n, args.seconds)[0], sync, graph, outs)
                eager, fixed = torch.cat(outs[0]).float(), torch.cat(outs[1]).float()
                res[f"N{n}_graph"]["rel_err"] = float((fixed - eager).norm() / eager.norm())
            for key in (f"N{n}", f"N{n}_graph"):
                if key in res:
                    print(key, {k: round(v, 4) for k, v in res[key].items()}, file=sys.stderr, flush=True)
        if args.table:
            from torch.profiler import ProfilerActivity, profile

            ss, _ = streams(enc, ns[-1], args.seconds)
            acts = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
            with profile(activities=acts) as prof:
                commit(enc, embed, ss, sync)
            ka = prof.key_averages()
            Path(args.table).write_text(
                f"N={ns[-1]} commit\n" + ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
                + "\n" + (ka.table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60) if cuda else ""))
    print_line({k: ({a: round(b, 3) for a, b in v.items()} if isinstance(v, dict) else v) for k, v in res.items()},
               args.out)


if __name__ == "__main__":
    main()
