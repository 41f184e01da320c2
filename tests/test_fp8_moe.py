"""fp8 experts: the grouped fp8 Triton kernel (run by Triton's interpreter on CPU) against the torch reference,
and a model whose experts `--quantization fp8` keeps in fp8 against the same model with those weights
dequantized: same outputs, only fp8 bytes and float32 scales held.

The interpreter only works when TRITON_INTERPRET=1 is set before triton is first imported, which another
test module may already have done, so the kernel cases run in a child process: this file run as a script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
import torch  # noqa: E402

from models import registry  # noqa: E402
from models.common import fp8, fp8_moe, fused, skinny  # noqa: E402
from models.common.layers import MoE  # noqa: E402
from models.qwen3_omni.model import load_model  # noqa: E402
from models.qwen3_omni.placement import PipelineConfig  # noqa: E402
from models.qwen3_omni.program import build_pipeline  # noqa: E402
from pipelines import sampling  # noqa: E402
from pipelines.types import GenerationOptions, Message, Turn, TurnDone  # noqa: E402

# (rows per expert, N, K, split, dtype): experts without rows (first, middle, last), one with more rows than a
# tile, N and K not multiples of 128 with several blocks each way, gate/up halves with blocks of their own, and
# rows that need every tile of the grid (17 + 17 + 17 + 1 rows: 7 tiles, the grid's bound for 52 rows, 4 experts)
CASES = [
    ([0, 3, 0, 20, 1, 0], 200, 300, None, torch.bfloat16),
    ([2, 0, 17, 0], 96, 160, 48, torch.bfloat16),
    ([17, 17, 17, 1], 64, 128, None, torch.bfloat16),
    ([5, 0, 40], 130, 260, 65, torch.float32),
    ([0, 1, 0, 0], 16, 16, None, torch.float16),
]


def make_case(counts: list[int], n: int, k: int, split: int | None, dtype: torch.dtype, seed: int = 0):
    """(x, fp8 w, scales, ends, split): magnitudes differ from block to block and from gate to up, so a
    scale applied to the wrong block shows."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(len(counts), n, k, generator=g) * torch.logspace(-2, 1, k)
    split_at = n if split is None else split
    w[:, split_at:] *= 50
    halves = [fp8.quantize(w[:, :split_at]), fp8.quantize(w[:, split_at:])]
    q, scale = torch.cat([halves[0][0], halves[1][0]], 1), torch.cat([halves[0][1], halves[1][1]], 1)
    x = torch.randn(sum(counts), k, generator=g).to(dtype)
    return x, q, scale, torch.tensor(counts).cumsum(0).to(torch.int32), split


def kernel_matches_reference(counts, n, k, split, dtype) -> None:
    x, q, scale, ends, split = make_case(counts, n, k, split, dtype)
    got = fp8_moe.grouped_mm_triton(x, q, scale, ends, split)
    want = fp8_moe.grouped_mm_reference(x, q, scale, ends, split)
    assert got.dtype == dtype and got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    else:  # the same float32 sums up to order, rounded to x's dtype (toward zero by the interpreter): one step
        step = 2**-7 if dtype == torch.bfloat16 else 2**-10
        err = (got.float() - want.float()).abs()
        assert (err <= want.float().abs() * step + 1e-4 * float(want.float().abs().max())).all(), float(err.max())


def dispatch_matches_reference(counts, n, k, split, dtype) -> None:
    """The same case with the sorted rows gathered from tokens (2 copies each) and scattered to their copies'
    places times their weights: the kernel against the reference, and the reference against doing it by hand."""
    x, q, scale, ends, split = make_case(counts, n, k, split, dtype)
    m = x.shape[0]
    g = torch.Generator().manual_seed(1)
    tokens = torch.randn(-(-m // 2), k, generator=g).to(dtype)
    d = fp8_moe.Dispatch(torch.randperm(m, generator=g), 2, torch.rand(m, generator=g).to(dtype))
    for kind in ("gather", "scatter"):
        src = tokens if kind == "gather" else x
        got = fp8_moe.grouped_mm_triton(src, q, scale, ends, split, **{kind: d})
        want = fp8_moe.grouped_mm_reference(src, q, scale, ends, split, **{kind: d})
        plain = fp8_moe.grouped_mm_reference(tokens[d.order // 2] if kind == "gather" else x, q, scale, ends, split)
        if kind == "scatter":
            by_hand = torch.empty_like(plain)
            by_hand[d.order] = plain * d.weights[d.order, None]
            plain = by_hand
        assert torch.equal(want, plain), kind
        assert got.shape == want.shape and got.dtype == dtype, kind
        tol = {torch.float32: 1e-5, torch.bfloat16: 2**-6, torch.float16: 2**-9}[dtype]
        err = (got.float() - want.float()).abs()
        bound = want.float().abs() * tol + 1e-4 * float(want.float().abs().max())
        assert (err <= bound).all(), (kind, float(err.max()))


def run_kernel_cases() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    from models.common import fp8_moe_kernel

    assert isinstance(fp8_moe_kernel.grouped_kernel, InterpretedFunction)
    for wide in (None, (32, 64, 128, 4, 2)):  # the decode's tiles; a prefill's wide ones (float32 dots off CUDA)
        fp8_moe.PREFILL, fp8_moe.PREFILL_ROWS = wide, 1
        for case in CASES:
            print("case", wide, case, flush=True)
            kernel_matches_reference(*case)
            dispatch_matches_reference(*case)
    print(f"{len(CASES)} kernel cases passed, both tilings")


def test_kernel_matches_reference_in_interpreter():
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "OMP_NUM_THREADS": "1"}
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-6000:]
    assert f"{len(CASES)} kernel cases passed, both tilings" in child.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the wide tiles' 16-bit dot runs on CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wide_tiles_with_16_bit_dots_match_the_reference_on_cuda(dtype):
    """A prefill's rows (PREFILL_ROWS or more) take the wide tiles, their dots in x's dtype: the same float32 sums
    as the reference's up to order, rounded once; gathered and scattered alike."""
    counts = [700, 0, 1500, 5, 900, 0, 17, 1]
    x, q, scale, ends, split = make_case(counts, 400, 1100, 200, dtype)
    assert x.shape[0] >= fp8_moe.PREFILL_ROWS and fp8_moe.PREFILL is not None
    cuda = [t.cuda() for t in (x, q, scale, ends)]
    step = 2**-7 if dtype == torch.bfloat16 else 2**-10
    want = fp8_moe.grouped_mm_reference(x, q, scale, ends, split).float()
    got = fp8_moe.grouped_mm_triton(*cuda, split).float().cpu()
    assert ((got - want).abs() <= want.abs() * step + 1e-4 * float(want.abs().max())).all()
    d = fp8_moe.Dispatch(torch.randperm(x.shape[0]), 1, torch.rand(x.shape[0]).to(dtype))
    want = fp8_moe.grouped_mm_reference(x, q, scale, ends, split, scatter=d).float()
    cd = fp8_moe.Dispatch(d.order.cuda(), 1, d.weights.cuda())
    got = fp8_moe.grouped_mm_triton(*cuda, split, scatter=cd).float().cpu()
    assert ((got - want).abs() <= want.abs() * 2 * step + 1e-4 * float(want.abs().max())).all()


def test_reference_is_a_matmul_by_each_experts_dequantized_weight():
    x, q, scale, ends, split = make_case([3, 0, 2], 200, 300, 100, torch.float32)
    y = fp8_moe.grouped_mm_reference(x, q, scale, ends, split)
    for e, (a, b) in enumerate([(0, 3), (3, 3), (3, 5)]):
        w = torch.cat([fp8.dequantize(q[e, :100], scale[e, :1], fp8.BLOCK),
                       fp8.dequantize(q[e, 100:], scale[e, 1:], fp8.BLOCK)])
        torch.testing.assert_close(y[a:b], x[a:b] @ w.T)


def test_mismatched_scales_are_refused_before_launch():
    x, q, scale, ends, _ = make_case([3, 2], 200, 300, None, torch.bfloat16)
    with pytest.raises(ValueError, match="do not match"):
        fp8_moe.grouped_mm_triton(x, q, scale, ends, 150)  # halves of 150 and 50 rows: 2 + 1 block rows, not 2
    with pytest.raises(ValueError, match="do not match"):
        fp8_moe.grouped_mm_triton(x[:, :256], q, scale, ends)


def dequantized_twin(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A model loaded alike whose experts hold `model`'s fp8 experts dequantized in `dtype`."""
    twin = load_model("tiny", dtype=dtype)
    ours = [m.experts for m in model.modules() if isinstance(m, MoE)]
    with torch.no_grad():
        for mine, theirs in zip([m.experts for m in twin.modules() if isinstance(m, MoE)], ours, strict=True):
            mine.w13.copy_(fp8_moe.dequantize_split(theirs.w13, theirs.w13_scale_inv, theirs.w13.shape[1] // 2))
            mine.w2.copy_(fp8_moe.dequantize_split(theirs.w2, theirs.w2_scale_inv))
    return twin


def test_fp8_experts_forward_equals_dequantized_weights():
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        model = load_model("tiny", dtype=dtype)
        fp8.fp8_experts_(model)
        twin = dequantized_twin(model, dtype)
        pairs = list(zip([m for m in model.modules() if isinstance(m, MoE)],
                         [m for m in twin.modules() if isinstance(m, MoE)], strict=True))
        assert len(pairs) == 6
        g = torch.Generator().manual_seed(1)
        for ours, theirs in pairs:
            x = torch.randn(2, 5, ours.gate.in_features, generator=g).to(dtype)
            with torch.no_grad():
                got, want = ours(x), theirs(x)
            assert got.dtype == dtype and not torch.equal(got, torch.zeros_like(got))
            torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * float(want.abs().max()))


def test_fp8_experts_hold_only_fp8_bytes_and_scales():
    bf16 = load_model("tiny", dtype=torch.bfloat16)
    model = load_model("tiny", dtype=torch.bfloat16)
    fp8.fp8_experts_(model)
    saved = 0
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        ex = moe.experts
        e, n, k = ex.w13.shape
        held = {name: t for name, t in [*ex.named_parameters(), *ex.named_buffers()]}
        assert {name: t.dtype for name, t in held.items()} == {
            "w13": fp8.FP8, "w2": fp8.FP8, "w13_scale_inv": torch.float32, "w2_scale_inv": torch.float32}
        scales = e * 2 * -(-(n // 2) // 128) * -(-k // 128) + e * -(-k // 128) * -(-(n // 2) // 128)
        assert sum(t.nbytes for t in held.values()) == e * n * k + e * k * (n // 2) + 4 * scales
        saved += e * n * k + e * k * (n // 2) - 4 * scales
    def size(m):
        return sum(t.nbytes for t in [*m.parameters(), *m.buffers()])
    assert size(bf16) - size(model) == saved > 0
    moved = model.to(torch.device("cpu"))
    assert all(m.experts.w13.dtype == fp8.FP8 for m in moved.modules() if isinstance(m, MoE))
    again = load_model("tiny", dtype=torch.bfloat16)
    fp8.fp8_experts_(again)
    again.load_state_dict(model.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values(),
                                                 strict=True))


def test_a_quantized_turn_equals_the_dequantized_twins():
    """registry's --quantization fp8 quantizes before the pipeline is built: its greedy turn equals the one of
    the same model with those fp8 experts held dequantized."""
    turn = Turn("s", [Message("user", "Hello!")], GenerationOptions(greedy=True, max_text_tokens=5, max_frames=3))
    with registry.build_pipeline("tiny", quantization="fp8") as p:
        model = p.program.model
        assert all(m.experts.w13.dtype == fp8.FP8 for m in model.modules() if isinstance(m, MoE))
        done = p.run(turn, timeout_s=300)[-1]
    with build_pipeline(PipelineConfig(model="tiny"), dequantized_twin(model, torch.float32)) as p:
        ref = p.run(turn, timeout_s=300)[-1]
    assert isinstance(done, TurnDone) and isinstance(ref, TurnDone), (done, ref)
    assert done.text_ids == ref.text_ids and len(done.text_ids) > 0
    assert done.codes == ref.codes and len(done.codes) > 0


if __name__ == "__main__":
    run_kernel_cases()


def test_no_triton_gathers_and_scatters_with_torch_ops_to_the_same_result():
    """`--no-triton` (fused.use_triton(False)) turns every kernel switch off, the fp8 experts' gather and scatter
    among them: torch's indexing then feeds and places the grouped matmul's rows, with the same result."""
    model = load_model("tiny", dtype=torch.float32)
    fp8.fp8_experts_(model)
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(3, 4, m.gate.in_features, generator=g) for m in layers]
    with torch.no_grad():
        inside = [m(x) for m, x in zip(layers, xs, strict=True)]
        fused.use_triton(False)
        try:
            assert set(fused.SWITCHES) == fused.OFF
            assert not (skinny.ENABLED or sampling.FUSED or fp8_moe.DISPATCH)
            apart = [m(x) for m, x in zip(layers, xs, strict=True)]
        finally:
            fused.use_triton(True)
    assert not fused.OFF and skinny.ENABLED and sampling.FUSED and fp8_moe.DISPATCH
    for a, b in zip(inside, apart, strict=True):
        assert not torch.equal(a, torch.zeros_like(a))
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
