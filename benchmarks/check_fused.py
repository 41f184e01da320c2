"""GPU check of models/common/fused.py against the eager layers, bf16, real shapes, T=1, batch 1 and 64.

For each op and shape: max |fused - eager|, that over max |eager|, the fraction of elements not
bit-identical, whether the fused op replays in a CUDA graph to eager's values, and the time per op
(microseconds, medians of CUDA events) launched one by one and replayed in a graph (20 ops per graph),
for eager, fused, torch.nn.functional.rms_norm and torch.compile'd eager. Failures are recorded, not raised.
The MoE router (bf16 gate logits of N tokens, also N=4096 as in a prefill) compares its float32 weights (max
abs and relative difference) and expert ids (the fraction equal to eager's, the fraction of tokens routed to the
same experts, the fraction of tokens whose top k + 1 probabilities hold equal ones) instead. A MoE's dispatch
(`fused.align`: the copies' order by expert and each expert's end) must equal argsort's and searchsorted's.

  python3 benchmarks/check_fused.py    # one JSON line on stdout; ~3-4 min, mostly torch.compile
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.common import fused  # noqa: E402
from models.common.fused import rms_norm_torch  # noqa: E402
from models.common.fused import rope_torch as apply_rope  # noqa: E402
from models.common.layers import RMSNorm, Rope, attention  # noqa: E402

MODELS = {"thinker": (2048, 32, 4, 1e-6), "talker": (1024, 16, 2, 1e-6), "code_predictor": (1024, 16, 8, 1e-6)}
D, REPS, PER_GRAPH, BATCHES = 128, 200, 20, (1, 64)
ROUTERS = {"thinker": (2048, 128, 8, True), "talker": (1024, 128, 6, True)}  # hidden, experts, top k, renormalise
ROUTE_BATCHES = (1, 64, 4096)


def event_us(fn, reps: int = REPS) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in pairs:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return 1000 * statistics.median(s.elapsed_time(e) for s, e in pairs)


def graphed(fn, per_graph: int = PER_GRAPH):
    """A CUDA graph of per_graph calls of fn; returns (replay, the last call's outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            out = fn()
    g.replay()
    torch.cuda.synchronize()
    return g.replay, out


def as_tuple(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def compare(got, want) -> dict:
    g, w = (torch.cat([t.float().flatten() for t in as_tuple(o)]) for o in (got, want))
    diff = (g - w).abs().max().item()
    return {"max_abs": diff, "rel": diff / w.abs().max().item(), "mismatch": (g != w).float().mean().item()}


def try_(record: dict, key: str, f):
    try:
        return f()
    except Exception as e:  # recorded: a variant that cannot run here is a finding, not a crash
        record.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}"[:300]
        traceback.print_exc(limit=-2, file=sys.stderr)
        return None


def case(op: str, model: str, batch: int, variants: dict) -> dict:
    rec = {"op": op, "model": model, "batch": batch, "us": {}, "graph_us": {}}
    want = variants["eager"]()
    for name, fn in variants.items():
        got = try_(rec, name, fn)
        if got is None:
            continue
        if name != "eager":
            rec[f"vs_eager[{name}]"] = compare(got, want)
        rec["us"][name] = try_(rec, name + "/time", lambda fn=fn: round(event_us(fn), 2))
        g = try_(rec, name + "/graph", lambda fn=fn: graphed(fn))
        if g is not None:
            replay, out = g
            rec.setdefault("graph_equals_eager_call", {})[name] = all(
                torch.equal(a, b) for a, b in zip(as_tuple(out), as_tuple(fn()), strict=True))
            rec["graph_us"][name] = round(event_us(replay, 50) / PER_GRAPH, 2)
    return rec


def model_cases(model: str, hidden: int, hq: int, hkv: int, eps: float, info: dict) -> list[dict]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    norm, qn, kn = (RMSNorm(n, eps).to(dev, dt).requires_grad_(False) for n in (hidden, D, D))
    for m in (norm, qn, kn):
        m.weight.copy_(1 + 0.2 * torch.randn_like(m.weight))

    def eager_qk(q, k, cos, sin):
        q, k = rms_norm_torch(q, qn.weight, eps), rms_norm_torch(k, kn.weight, eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def eager_norm(x):  # RMSNorm.forward's torch path (the module itself takes the fused kernel on CUDA)
        return rms_norm_torch(x, norm.weight, eps)

    c_norm = try_(info, f"compile_norm[{model}]", lambda: torch.compile(eager_norm, dynamic=False))
    c_qk = try_(info, f"compile_qk[{model}]", lambda: torch.compile(eager_qk, dynamic=False))

    def at_batch(b: int) -> list[dict]:
        x, r = torch.randn(b, 1, hidden, device=dev, dtype=dt), torch.randn(b, 1, hidden, device=dev, dtype=dt)
        qkv = torch.randn(b, 1, (hq + 2 * hkv) * D, device=dev, dtype=dt)
        q, k, _ = qkv.split([hq * D, hkv * D, hkv * D], dim=-1)  # as SelfAttention.forward makes them
        q, k = q.view(b, 1, -1, D), k.view(b, 1, -1, D)
        cos, sin = Rope(D, 1e6)(torch.randint(0, 4000, (b, 1), device=dev), dt)
        w = norm.weight
        return [
            case("rms_norm", model, b, {
                "eager": lambda: eager_norm(x), "fused": lambda: fused.rms_norm(x, w, eps),
                "F.rms_norm": lambda: F.rms_norm(x, (hidden,), w, eps), "compiled": lambda: c_norm(x)}),
            case("add_rms_norm", model, b, {
                "eager": lambda: (x + r, eager_norm(x + r)), "fused": lambda: fused.add_rms_norm(x, r, w, eps)}),
            case("qk_norm_rope", model, b, {
                "eager": lambda: eager_qk(q, k, cos, sin),
                "fused": lambda: fused.qk_norm_rope(q, k, qn.weight, kn.weight, eps, cos, sin),
                "compiled": lambda: c_qk(q, k, cos, sin)}),
        ]

    return [rec for b in BATCHES for rec in at_batch(b)]


def route_agreement(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor],
                    logits: torch.Tensor, k: int) -> dict:
    (w, idx), (want_w, want_idx) = got, want
    d = (w - want_w).abs()
    top = torch.softmax(logits, dim=-1, dtype=torch.float32).topk(k + 1, dim=-1).values
    return {"weights_max_abs": d.max().item(), "weights_max_rel": (d / want_w).nan_to_num(0.0).max().item(),
            "idx_equal": (idx == want_idx).float().mean().item(),
            "same_experts": (idx.sort(-1).values == want_idx.sort(-1).values).all(-1).float().mean().item(),
            "tied_rows": (top[:, 1:] == top[:, :-1]).any(-1).float().mean().item()}


def route_cases(model: str, hidden: int, experts: int, k: int, norm: bool, info: dict) -> list[dict]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    gate = torch.randn(experts, hidden, device=dev, dtype=dt) * hidden**-0.5

    def eager(logits):
        return fused.route_torch(logits, k, norm)

    compiled = try_(info, f"compile_route[{model}]", lambda: torch.compile(eager, dynamic=False)) if COMPILE else None

    def at_batch(b: int) -> dict:
        logits = torch.randn(b, hidden, device=dev, dtype=dt) @ gate.T  # as MoE.forward's gate makes them
        variants = {"eager": lambda: eager(logits), "fused": lambda: fused.route(logits, k, norm)}
        if compiled is not None:
            variants["compiled"] = lambda: compiled(logits)
        rec = case("route", model, b, variants)
        for name in ("fused", "compiled"):
            if f"vs_eager[{name}]" in rec:  # weights and ids apart, not compare()'s one max over both
                rec[f"vs_eager[{name}]"] = route_agreement(variants[name](), eager(logits), logits, k)
        return rec

    return [at_batch(b) for b in ROUTE_BATCHES]


def frame_attention_cases() -> list[dict]:
    """The code predictor's attention at its last step (15 cached positions and one new), fused against the torch
    path (the new key and value stored, then SDPA over the buffer)."""
    dev, dt, hq, hkv, d, p = torch.device("cuda"), torch.bfloat16, 16, 8, D, 16

    def at_batch(b: int) -> dict:
        kb, vb = torch.randn(b, p, hkv, d, device=dev, dtype=dt), torch.randn(b, p, hkv, d, device=dev, dtype=dt)
        qkv = torch.randn(b, 1, (hq + 2 * hkv) * d, device=dev, dtype=dt)
        q, k, v = (t.view(b, 1, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))

        def eager():
            kb[:, p - 1 :], vb[:, p - 1 :] = k, v
            return attention(q, kb, vb, d**-0.5, p - 1)

        return case("frame_attention", "code_predictor", b, {
            "eager": eager, "fused": lambda: fused.frame_attention_triton(q, k, v, kb, vb, p - 1, d**-0.5)})

    return [at_batch(b) for b in BATCHES]


def align_cases() -> list[dict]:
    """A MoE's dispatch of the copies of 1, 64 and 128 tokens over 128 experts (top 8): the one-program sort
    against argsort and searchsorted; order and ends must be equal ("mismatch" 0)."""
    def at_batch(b: int) -> dict:
        ids = torch.randint(0, 128, (b * 8,), device="cuda")
        return case("align", "moe", b, {"eager": lambda: fused.align_torch(ids, 128),
                                        "fused": lambda: fused.align_triton(ids, 128)})

    return [at_batch(b) for b in (1, 64, 128)]


COMPILE = True


def main() -> None:
    global COMPILE
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-only", action="store_true",
                    help="the router's, the frame attention's and the MoE dispatch's cases alone, without "
                    "torch.compile")
    args = ap.parse_args()
    COMPILE = not args.new_only
    if not torch.cuda.is_available():
        sys.exit("check_fused.py needs a CUDA device")
    torch.manual_seed(0)
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    info["fused_takes_triton_path"] = fused._use_triton("norm", torch.ones(1, device="cuda"))
    info["triton"] = try_(info, "triton", lambda: __import__("triton").__version__)
    info["cases"] = [] if args.new_only else [
        rec for model, shape in MODELS.items() for rec in model_cases(model, *shape, info)]
    info["cases"] += [rec for model, shape in ROUTERS.items() for rec in route_cases(model, *shape, info)]
    info["cases"] += frame_attention_cases()
    info["cases"] += align_cases()
    print(json.dumps(info))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
