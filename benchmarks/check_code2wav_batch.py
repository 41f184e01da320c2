"""Code2WavSlots.step at full size on the GPU: eager vs one captured CUDA graph per batch size.

  python benchmarks/check_code2wav_batch.py [--buckets 1,8,64] [--iters 50]
  python benchmarks/check_code2wav_batch.py --tiny --device cpu   # the same code, eager only

Random weights, bf16. Every slot holds a stream of `--frames` frames before timing. Per batch size:
ms per step eager and as a graph replay, and the largest difference between one eager step and one
replay from the same state (samples and every state buffer). Also one 80-frame stream (longer than
the window) through push + step vs the one-shot decode and vs push alone, relative L2.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.common import code2wav  # noqa: E402
from models.common.code2wav import Code2Wav, conv_matmul  # noqa: E402
from models.common.code2wav_batch import Code2WavSlots  # noqa: E402
from models.common.weights import random_weights_  # noqa: E402
from models.qwen3_omni.config import OmniConfig  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config  # noqa: E402


def state(dec: Code2WavSlots) -> list[torch.Tensor]:
    return [dec.k, dec.v, dec.frames, *dec.tails.values(), *dec.pending.values()]


def timed(fn, iters: int, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000 / iters


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().reshape(-1), b.float().reshape(-1)
    return float((a - b).norm() / b.norm())


@torch.no_grad()
def bucket(dec: Code2WavSlots, size: int, iters: int, codes: torch.Tensor) -> dict:
    cuda = codes.is_cuda
    slots = torch.arange(size, device=codes.device)
    frame = codes[:size, :, 0].clone()
    step = lambda: dec.step(slots, frame)  # noqa: E731
    side = torch.cuda.Stream() if cuda else None
    if cuda:  # warm up on a side stream before capture, as torch.cuda.graph's docs ask
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    if cuda:
        torch.cuda.current_stream().wait_stream(side)
    result = {"eager_ms": round(timed(step, iters, cuda), 3)}
    if not cuda:
        return result
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    result["graph_ms"] = round(timed(graph.replay, iters, cuda), 3)
    saved = [t.clone() for t in state(dec)]
    eager = step()
    after = [t.clone() for t in state(dec)]
    for t, s in zip(state(dec), saved, strict=True):
        t.copy_(s)
    graph.replay()
    torch.cuda.synchronize()
    result["graph_vs_eager_max_abs"] = float((out.float() - eager.float()).abs().max())
    result["state_graph_vs_eager_max_abs"] = max(
        float((t.float() - a.float()).abs().max()) for t, a in zip(state(dec), after, strict=True)
    )
    result["peak"] = float(eager.float().abs().max())
    return result


@torch.no_grad()
def long_stream(model: Code2Wav, codes: torch.Tensor) -> dict:
    dec = Code2WavSlots(model, 2, codes.device, torch.bfloat16, clamp=False)
    slot = dec.open()
    outs = [dec.push(slot, codes[..., 0])]
    for f in range(1, codes.shape[-1]):
        outs.append(dec.step(torch.tensor([dec.scratch, slot], device=codes.device), codes[0, :, f].expand(2, -1))[1:])
    got = torch.cat(outs, dim=-1)
    eager = dec.open()  # every frame through push, the eager path
    streamed = torch.cat([dec.push(eager, codes[..., f]) for f in range(codes.shape[-1])], dim=-1)
    whole = model.decode(codes, clamp=False)
    return {"frames": codes.shape[-1], "vs_decode_rel": rel(got, whole), "vs_stream_rel": rel(got, streamed),
            "stream_vs_decode_rel": rel(streamed, whole)}


@torch.no_grad()
def conv_layers(dec: Code2WavSlots, n: int, codes: torch.Tensor, iters: int) -> list[list]:
    """Each Conv1d of one streaming step at batch n, on the input it was given there: ms with cuDNN's default
    algorithm, with cuDNN's benchmark mode, and as conv_matmul (groups 1), and conv_matmul's relative error."""
    seen: list[tuple[torch.nn.Conv1d, torch.Tensor]] = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.append((mod, inp[0].clone())))
             for m in dec.model.modules() if isinstance(m, torch.nn.Conv1d)]
    faster, code2wav._matmul_faster = code2wav._matmul_faster, lambda conv, x: False  # every conv through its module
    try:
        dec.step(torch.arange(n, device=codes.device), codes[:n, :, 0].clone())
    finally:
        code2wav._matmul_faster = faster
        for h in hooks:
            h.remove()
    rows = []
    for conv, x in seen:
        want = conv(x)
        row = [conv.in_channels, conv.out_channels, conv.kernel_size[0], conv.dilation[0], conv.groups,
               x.shape[-1], round(timed(lambda c=conv, x=x: c(x), iters, True), 4)]
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=True):
            conv(x)
            row.append(round(timed(lambda c=conv, x=x: c(x), iters, True), 4))
        if conv.groups == 1 and conv.bias is not None:
            matmul_ms = timed(lambda c=conv, x=x: conv_matmul(x, c), iters, True)
            row += [round(matmul_ms, 4), rel(conv_matmul(x, conv), want)]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--buckets", default="1,8,64")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--layers", action="store_true", help="CUDA: time each Conv1d of the largest batch's step "
                    "(cuDNN default, cuDNN benchmark mode, conv_matmul)")
    ap.add_argument("--profile-dir", help="CUDA: write an eager kernel profile of the largest batch size's step here")
    args = ap.parse_args()
    sizes, dev = [int(b) for b in args.buckets.split(",")], torch.device(args.device)
    cfg = OmniConfig.from_hf(tiny_config("a") if args.tiny else json.loads(FULL_CONFIG.read_text())).code2wav
    model = Code2Wav(cfg).to(dev)
    random_weights_(model, 0)
    model = model.to(torch.bfloat16).eval().requires_grad_(False)
    g = torch.Generator(device=dev).manual_seed(0)
    codes = torch.randint(0, cfg.codebook_size, (max(sizes), cfg.num_quantizers, 80), device=dev, generator=g)
    dec = Code2WavSlots(model, max(sizes), dev, torch.bfloat16)
    with torch.no_grad():
        for row in range(max(sizes)):
            dec.push(dec.open(), codes[row : row + 1, :, : args.frames])
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    out = {"device": name, "tiny": args.tiny, "torch": torch.__version__, "dtype": "bfloat16"}
    out["buckets"] = {str(s): bucket(dec, s, args.iters, codes) for s in sorted(sizes, reverse=True)}
    out["long_stream"] = long_stream(model, codes[:1])
    if args.layers and dev.type == "cuda":
        out["conv_layers"] = conv_layers(dec, max(sizes), codes, args.iters)
    if args.profile_dir and dev.type == "cuda":
        from benchmarks.bench_step import profile

        n = max(sizes)
        slots, frame = torch.arange(n, device=dev), codes[:n, :, 0].clone()
        with torch.no_grad():
            profile(lambda _: dec.step(slots, frame), {}, Path(args.profile_dir) / f"profile_code2wav_B{n}.txt")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
