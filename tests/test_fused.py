"""The fused Triton kernels (models/common/fused.py) against today's eager layers.

The kernels run on CPU under Triton's interpreter, in a subprocess: TRITON_INTERPRET must be set
before triton is first imported, and another test module may already have imported it here. The
interpreter casts float32 -> bfloat16 by truncation where the GPU rounds to nearest even, so the
subprocess swaps in a nearest-even cast; float16 and bfloat16 then check eager's roundings bit for
bit. The router's weights, float32 from any input, are checked to a few float32 ulp and its expert ids
exactly. benchmarks/check_fused.py measures bfloat16 on the GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from models.common import fused
from models.common.fused import rope_torch as apply_rope
from models.common.layers import RMSNorm, Rope, SelfAttention

pytestmark = pytest.mark.skipif(not fused.HAVE_TRITON, reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[1]

# Each case prints: name, dtype, max |fused - eager|, max |eager|, fraction of elements not bit-identical.
SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from models.common import fused
    from models.common.fused import rope_torch as apply_rope
    from models.common.code2wav import SnakeBeta
    from models.common.layers import RMSNorm, Rope, SelfAttention

    imported_triton = "triton" in sys.modules  # importing the model must not import triton

    import triton.language as tl
    from triton.runtime import interpreter

    truncating = interpreter._convert_float

    def nearest_even(data, src, dst, rounding):  # the GPU's float32 -> bfloat16 cast, instead of truncation
        if src == tl.float32 and dst == tl.bfloat16:
            return torch.from_numpy(data.copy()).to(torch.bfloat16).view(torch.int16).numpy().view("uint16")
        return truncating(data, src, dst, rounding)

    interpreter._convert_float = nearest_even

    torch.manual_seed(0)
    out = []

    def report(name, dtype, got, want):
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
            d = (g.float() - w.float()).abs().max().item()
            out.append([name, str(dtype), d, w.float().abs().max().item(), (g != w).float().mean().item()])

    routes, edges = [], []

    # Each route case prints: name, dtype, max |fused - torch| and max of that over |torch| for the weights, the
    # fraction of rows whose ids equal the lowest-id-first order of torch's probabilities, the number of rows
    # whose top k + 1 probabilities hold equal ones, and the fraction of the other rows with torch's topk's ids.
    def route(name, dtype, logits, k, renorm):
        (w, idx), (want_w, want_idx) = fused.route_triton(logits, k, renorm), fused.route_torch(logits, k, renorm)
        assert w.dtype == want_w.dtype and idx.dtype == want_idx.dtype and idx.shape == want_idx.shape == w.shape
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        first = probs.sort(dim=-1, descending=True, stable=True)
        top = first.values[:, : k + 1]
        tied = (top[:, 1:] == top[:, :-1]).any(-1)
        d = (w - want_w).abs()
        routes.append([name, str(dtype), d.max().item(), (d / want_w.abs()).nan_to_num(0.0).max().item(),
                       (idx == first.indices[:, :k]).all(-1).float().mean().item(), tied.sum().item(),
                       (idx == want_idx).all(-1)[~tied].float().mean().item() if not tied.all() else 1.0])

    def norm(n, dtype):
        m = RMSNorm(n, 1e-6).to(dtype).requires_grad_(False)
        m.weight.normal_(1.0, 0.5)
        return m

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in [(1, 1, 128), (2, 3, 1024), (2, 1, 1280), (4, 1, 2048), (1, 2, 4096), (3, 1000)]:
            m = norm(shape[-1], dtype)
            x, r = torch.randn(shape).to(dtype) * 3, torch.randn(shape).to(dtype)
            report(f"rms_norm{shape}", dtype, [fused.rms_norm_triton(x, m.weight, m.eps)], [m(x)])
            s = r + x
            report(f"add_rms_norm{shape}", dtype, fused.add_rms_norm_triton(x, r, m.weight, m.eps), [s, m(s)])
        x = torch.randn(3, 2048).to(dtype)[:, ::2]  # a strided input
        m = norm(1024, dtype)
        report("rms_norm(strided)", dtype, [fused.rms_norm_triton(x, m.weight, m.eps)], [m(x)])

        for b, t, hq, hkv, cos_b in [(1, 1, 4, 2, 1), (2, 3, 2, 1, 1), (3, 1, 4, 4, 3)]:
            d = 128
            attn = SelfAttention(hq * d, hq, hkv, d, 1e-6, qk_norm=True).to(dtype).requires_grad_(False)
            attn.q_norm.weight.normal_(1.0, 0.5)
            attn.k_norm.weight.normal_(1.0, 0.5)
            qkv = torch.randn(b, t, (hq + 2 * hkv) * d).to(dtype) * 2
            q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)  # as SelfAttention.forward makes them
            q, k = q.view(b, t, -1, d), k.view(b, t, -1, d)
            assert b * t == 1 or not (q.is_contiguous() or k.is_contiguous())
            pos = torch.randint(0, 4000, (cos_b, t))
            cos, sin = Rope(d, 1e6)(pos, dtype)
            qn, kn = attn.q_norm(q), attn.k_norm(k)
            got = fused.qk_norm_rope_triton(q, k, attn.q_norm.weight, attn.k_norm.weight, 1e-6, cos, sin)
            report(f"qk_norm_rope{(b, t, hq, hkv)}", dtype, got, [apply_rope(qn, cos, sin), apply_rope(kn, cos, sin)])
            if cos_b < b:  # rope alone (Code2Wav's attention has no QK norm), on one shape to keep this quick
                got = fused.qk_norm_rope_triton(q, k, None, None, 1e-6, cos, sin)
                report(f"rope{(b, t, hq, hkv)}", dtype, got, [apply_rope(q, cos, sin), apply_rope(k, cos, sin)])
        for shape, strided in [((2, 96, 1974), False), ((1, 768, 40), False), ((3, 5, 7), False),
                               ((2, 96, 300), True)]:  # Code2Wav's widths; a ragged last block; a strided slice
            m = SnakeBeta(shape[1]).to(dtype).requires_grad_(False)
            m.alpha.normal_(0, 0.5)
            m.beta.normal_(0, 0.5)
            x = torch.randn(shape).to(dtype) * 2
            x = x[..., 100:] if strided else x
            got, want = fused.snake_triton(x, m.alpha, m.beta), fused.snake_torch(x, m.alpha, m.beta)
            report(f"snake{tuple(x.shape)}", dtype, [got], [want])
        for shape in [(1, 1, 6144), (3, 2, 768), (5, 2 * 1100), (4, 10)]:  # the predictor's; MoE experts'; ragged
            x = torch.randn(shape).to(dtype) * 3
            report(f"silu_mul{shape}", dtype, [fused.silu_mul_triton(x)], [fused.silu_mul_torch(x)])

        for n, e, k, renorm, ties in [(1, 128, 8, True, False), (3, 128, 6, False, False), (3, 128, 6, True, False),
                                      (64, 128, 8, True, False), (8, 60, 4, False, False), (3, 60, 4, True, False),
                                      (3, 128, 8, True, True), (3, 60, 4, False, True)]:
            logits = torch.randint(-3, 3, (n, e)) if ties else torch.randn(n, e) * 2  # ties: many equal logits
            route(f"route{(n, e, k, renorm)}{'(ties)' if ties else ''}", dtype, logits.to(dtype), k, renorm)
        logits = torch.randn(3, 60).to(dtype)
        logits[0, 7], logits[1, 3], logits[2] = float("nan"), float("inf"), float("-inf")
        logits[2, 5] = 0.0  # NaN rows; a row of one finite logit, the rest probability 0
        (w, idx), (want_w, _) = fused.route_triton(logits, 4, True), fused.route_torch(logits, 4, True)
        edges.append([str(dtype), torch.equal(w.isnan(), want_w.isnan()), w[2].tolist(), idx.tolist()])
    print(json.dumps({"imported_triton": imported_triton, "cases": out, "routes": routes, "edges": edges}))
    """
)


@pytest.fixture(scope="module")
def run() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreted(run: dict) -> list[list]:
    return run["cases"]


def test_importing_the_model_does_not_import_triton(run: dict) -> None:
    assert not run["imported_triton"]


@pytest.fixture(scope="module")
def routes(run: dict) -> list[list]:
    return run["routes"]


def test_interpreted_cases_cover_every_kernel_and_dtype(interpreted: list[list], routes: list[list]) -> None:
    names = {(name.split("(")[0], dtype) for name, dtype, *_ in interpreted + routes}
    kernels = {"rms_norm", "add_rms_norm", "qk_norm_rope", "rope", "snake", "route", "silu_mul"}
    assert names == {(k, f"torch.{d}") for k in kernels for d in ("float32", "float16", "bfloat16")}


@pytest.mark.parametrize(
    "dtype, rel, identical",
    [("torch.float32", 2e-6, 0.0), ("torch.float16", 2**-10, 0.99), ("torch.bfloat16", 2**-7, 0.99)],
)
def test_kernels_match_eager(interpreted: list[list], dtype: str, rel: float, identical: float) -> None:
    """float32: to float32 rounding (rsqrt and summation order differ from torch's); float16, bfloat16:
    the same roundings, so bit-identical but for rare 1-ulp flips from those float32 differences."""
    for name, dt, diff, scale, mismatched in interpreted:
        if dt == dtype:
            assert diff <= rel * scale, (name, dt, diff, scale)
            assert 1 - mismatched >= identical, (name, dt, mismatched)


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.float16", "torch.bfloat16"])
def test_route_matches_torch(routes: list[list], dtype: str) -> None:
    """Weights within 2^-22 and a relative 2^-21, a few float32 ulp: the same exp(x - max) / sum, but sums in
    another order and, here, numpy's exp against torch's (on the GPU both take CUDA's expf); measured up to 3 *
    2^-24 and 5.7 * 2^-24. Ids: the lowest id first among equal probabilities, and else torch's topk's."""
    cases = [r for r in routes if r[1] == dtype]
    assert len(cases) == 8, cases
    for name, _, diff, rel, lowest_first, _, as_topk in cases:
        assert diff <= 2**-22 and rel <= 2**-21, (name, diff, rel)
        assert lowest_first == 1.0 and as_topk == 1.0, (name, lowest_first, as_topk)
    tied = {r[0]: r[5] for r in cases if r[0].endswith("(ties)")}
    assert len(tied) == 2 and all(tied.values()), tied


def test_route_keeps_nan_and_ids_in_range(run: dict) -> None:
    """NaN probabilities rank first, as in torch's topk; ties of zero probability go by the lowest id."""
    assert len(run["edges"]) == 3
    for dtype, nan_where_torch, zero_row, idx in run["edges"]:
        assert nan_where_torch and zero_row == [1.0, 0.0, 0.0, 0.0], (dtype, zero_row)
        assert idx == [[0, 1, 2, 3], [0, 1, 2, 3], [5, 0, 1, 2]], (dtype, idx)


def test_cpu_dispatch_is_todays_code() -> None:
    torch.manual_seed(1)
    m = RMSNorm(1280, 1e-6)
    with torch.no_grad():
        m.weight.normal_()
    x, r = torch.randn(2, 3, 1280), torch.randn(2, 3, 1280)
    with torch.no_grad():
        assert torch.equal(fused.rms_norm(x, m.weight, m.eps), m(x))
        s, normed = fused.add_rms_norm(x, r, m.weight, m.eps)
        assert torch.equal(s, x + r) and torch.equal(normed, m(x + r))
        attn = SelfAttention(512, 4, 2, 128, 1e-6, qk_norm=True)
        q, k = torch.randn(2, 3, 4, 128), torch.randn(2, 3, 2, 128)
        cos, sin = Rope(128, 1e6)(torch.arange(3).expand(2, 3), torch.float32)
        got = fused.qk_norm_rope(q, k, attn.q_norm.weight, attn.k_norm.weight, 1e-6, cos, sin)
        assert torch.equal(got[0], apply_rope(attn.q_norm(q), cos, sin))
        assert torch.equal(got[1], apply_rope(attn.k_norm(k), cos, sin))
        assert not fused._use_triton("norm", x, m.weight)
        logits = torch.randn(5, 60).to(torch.bfloat16)
        for norm in (False, True):
            probs = torch.nn.functional.softmax(logits, dim=-1, dtype=torch.float32)
            weights, idx = probs.topk(4, dim=-1)
            if norm:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            got = fused.route(logits, 4, norm)
            assert torch.equal(got[0], weights) and torch.equal(got[1], idx)


def test_bad_shapes_are_refused() -> None:
    cos = sin = torch.ones(1, 1, 127)
    with pytest.raises(ValueError, match="even D"):
        fused.qk_norm_rope_triton(torch.ones(1, 1, 2, 127), torch.ones(1, 1, 1, 127), None, None, 1e-6, cos, sin)
    with pytest.raises(ValueError, match="same B, T"):
        fused.qk_norm_rope_triton(torch.ones(1, 2, 2, 128), torch.ones(1, 1, 1, 128), None, None, 1e-6, cos, sin)
    with pytest.raises(ValueError, match="top_k 5 of 4 experts"):
        fused.route_triton(torch.ones(3, 4), 5, True)


COMPILE = textwrap.dedent(
    """
    import json, re, triton
    from triton.backends.compiler import GPUTarget
    from models.common import fused_kernels as K

    target = GPUTarget("cuda", 90, 32)  # an H200; compiling needs no GPU, only the bundled ptxas
    backend = triton.compiler.make_backend(target)
    NORM = {n: "*bf16" for n in ("x_ptr", "r_ptr", "w_ptr", "out_ptr", "sum_ptr")}
    NORM |= {n: "i32" for n in ("n", "sx", "sr", "so", "ss")} | {"eps": "fp32", "inv_n": "fp32"}
    ROPE = {n: "*bf16" for n in ("q_ptr", "k_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "qo_ptr", "ko_ptr")}
    ROPE |= {n: "i32" for n in "T HQ sqb sqt sqh skb skt skh scb sct ssb sst".split()}
    ROPE |= {"eps": "fp32", "inv_d": "fp32"}
    ROUTE = {"logits_ptr": "*bf16", "w_ptr": "*fp32", "idx_ptr": "*i64", "n_experts": "i32", "stride": "i32"}
    SILU = {"x_ptr": "*bf16", "out_ptr": "*bf16", "half": "i32", "stride": "i32"}
    ptx = {}
    for name, fn, sig, consts, opts in [  # the launch options fused.py passes
        ("add_rms_norm", K._norm_rows, NORM, {"HAS_RES": True, "BLOCK": 2048}, {"num_warps": 8}),
        ("qk_norm_rope", K._qk_norm_rope, ROPE, {"NORM": True, "HALF": 64, "BLOCK": 64}, {"num_warps": 1}),
        ("route", K._route, ROUTE, {"TOP_K": 8, "NORM": True, "BLOCK": 128, "K_BLOCK": 8},
         {"num_warps": 1, "enable_reflect_ftz": False}),
        ("silu_mul", K._silu_mul, SILU, {"BLOCK": 1024}, {"num_warps": 4, "enable_reflect_ftz": False}),
    ]:
        sig = {**sig, **dict.fromkeys(consts, "constexpr")}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts)
        opts = backend.parse_options({**opts, "enable_fp_fusion": False})
        text = triton.compile(src, target=target, options=opts.__dict__).asm["ptx"]
        ptx[name] = sorted(set(re.findall(r"\\b(?:cvt|fma|mul|add|sub|rsqrt|div)\\.[a-z0-9.]*f(?:32|16)\\b", text)))
    print(json.dumps(ptx))
    """
)


def test_kernels_compile_for_the_h200_with_eagers_roundings() -> None:
    """Compiled (not interpreted) for sm_90: bfloat16 rounds to nearest even, products are not fused into FMAs;
    the router divides and exponentiates as torch's softmax does."""
    if not (Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia").is_dir():
        pytest.skip("triton has no NVIDIA backend here")
    proc = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    ptx = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("route", "silu_mul"):  # divisions rounded as torch's; exp is CUDA's expf (fma range reduction)
        ops = ptx.pop(name)
        assert "div.rn.f32" in ops and "fma.rn.f32" in ops, (name, ops)
        assert not any(".ftz" in op or op.startswith(("div.full", "div.approx")) for op in ops), (name, ops)
    for name, ops in ptx.items():
        assert "cvt.rn.bf16.f32" in ops and "mul.rn.f32" in ops, (name, ops)
        assert not any(op.startswith("fma") for op in ops), (name, ops)


def test_kernels_switch_off_by_name_for_a_bisection() -> None:
    """`use_triton(False, names)` turns off just those (bench_load's `--no-triton route,sampling`); an unknown name
    is refused and changes nothing; `use_triton(True)` puts them all back."""
    from models.common import fp8_moe, skinny
    from pipelines import sampling

    x, w = torch.randn(2, 8), torch.ones(8)
    try:
        fused.use_triton(False, {"route", "sampling"})
        assert {"route", "sampling"} == fused.OFF and not sampling.FUSED and skinny.ENABLED and fp8_moe.DISPATCH
        with pytest.raises(ValueError, match="bogus"):
            fused.use_triton(False, {"norm", "bogus"})
        assert {"route", "sampling"} == fused.OFF
        fused.use_triton(True, {"sampling"})
        assert {"route"} == fused.OFF and sampling.FUSED
        assert not fused._use_triton("route", x, w)  # and on CPU no kernel takes the Triton path at all
        assert not fused._use_triton("norm", x, w)
    finally:
        fused.use_triton(True)
    assert not fused.OFF and sampling.FUSED and skinny.ENABLED and fp8_moe.DISPATCH
