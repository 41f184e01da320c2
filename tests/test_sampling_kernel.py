"""pipelines/sampling_kernel.py (the CUDA sampler for codec-sized vocabularies) against sampling.py's torch path.

The kernel runs on CPU under Triton's interpreter, in a subprocess: TRITON_INTERPRET must be set before triton
is first imported. The same ids are asserted for every row: greedy and sampled rows, top-k through runs of equal
logits, top-p boundaries, the repetition penalty, per-vocabulary and per-row suppression, a row with every id
suppressed, a strided step counter, and each row alone against its batch. benchmarks/check_sampling.py
measures it on the GPU."""

from __future__ import annotations

import textwrap

import pytest

from pipelines import sampling
from tests.interpreted import compiled_for_h200, run_interpreted

pytestmark = pytest.mark.skipif(not sampling.HAVE_TRITON, reason="triton is not installed")

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from pipelines.sampling import Sampler, SamplingParams

    torch.manual_seed(0)
    cases = []

    def check(name, logits, params, step, seen=None, suppress=None, each=True):
        s = Sampler.of(params, "cpu")
        want = s(logits, step, seen, suppress)
        got = s.fused_call(logits, step, seen if s.any_penalty else None, suppress)
        alone = got.tolist() if not each else [Sampler.of([p], "cpu").fused_call(logits[i:i + 1], step[i:i + 1],
                                                   None if seen is None or not s.any_penalty else seen[i:i + 1],
                                                   suppress if suppress is None or suppress.dim() == 1
                                                   else suppress[i:i + 1]).item()
                 for i, p in enumerate(params)]
        cases.append([name, got.tolist(), want.tolist(), alone])

    spec = [SamplingParams(greedy=True), SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=3),
            SamplingParams(top_k=50, top_p=0.8, seed=5), SamplingParams(top_p=0.5, seed=9),
            SamplingParams(temperature=1.3, seed=1), SamplingParams(top_k=3, top_p=0.3, seed=2),
            SamplingParams(greedy=True, repetition_penalty=1.1)]
    for v, dtype in ((50, torch.float32), (2048, torch.bfloat16), (3072, torch.bfloat16)):
        b = len(spec)
        logits = (torch.randn(b, v) * 3).to(dtype)  # bfloat16 logits tie often
        seen = torch.rand(b, v) < 0.1
        suppress = torch.zeros(v, dtype=torch.bool)
        suppress[-10:] = True
        for st in range(2):
            check(f"codec v={v} step={st}", logits, spec, torch.arange(b) * 7 + st, seen, suppress)
    for trial in range(4):  # runs of equal logits; each top-k and top-p cuts through them; 3 draws of each row
        b, v, draws = 8, 16, 3
        logits = (torch.randint(-2, 2, (b, v)).float() * 0.5).repeat_interleave(draws, 0)
        params = [SamplingParams(top_k=int(torch.randint(0, 20, ())), top_p=float(torch.rand(())) * 0.99 + 0.01,
                                 temperature=0.7 + 0.1 * i, seed=10 * trial + i)
                  for i in range(b) for _ in range(draws)]
        suppress = (torch.rand(b, v) < 0.2).repeat_interleave(draws, 0)
        suppress[:draws] = trial % 2 == 0  # every id of row 0 suppressed in some trials
        steps = torch.arange(2 * b * draws).view(-1, 2)[:, 1] + trial  # a strided counter, as the predictor's
        check(f"ties {trial}", logits, params, steps, None, suppress, each=False)
    print(json.dumps(cases))
    """
)


@pytest.fixture(scope="module")
def cases() -> list[list]:
    return run_interpreted(SCRIPT)


def test_the_kernel_draws_the_torch_paths_ids(cases: list[list]) -> None:
    assert len(cases) == 10
    for name, got, want, _ in cases:
        assert got == want, name


def test_the_kernel_draws_each_row_as_alone(cases: list[list]) -> None:
    for name, got, _, alone in cases:
        assert got == alone, name


def test_the_cases_sample_and_cut(cases: list[list]) -> None:
    """The draws differ from step to step (they are sampled, not argmax) and the greedy rows do not."""
    codec = [got for name, got, _, _ in cases if name.startswith("codec v=2048")]
    assert len({tuple(g[1:6]) for g in codec}) == len(codec)
    assert len({(g[0], g[6]) for g in codec}) == 1


COMPILE = textwrap.dedent(
    """
    from pipelines import sampling_kernel as K

    ptrs = ("logits_ptr", "seen_ptr", "penalty_ptr", "suppress_ptr", "greedy_ptr", "temperature_ptr", "top_k_ptr",
            "top_p_ptr", "seed_ptr", "step_ptr", "out_ptr")
    types = ("*bf16", "*i1", "*fp32", "*i1", "*i1", "*fp32", "*i32", "*fp32", "*i64", "*i64", "*i64")
    sig = dict(zip(ptrs, types)) | dict.fromkeys(("s_logits", "n", "s_seen", "s_suppress", "s_step"), "i32")
    for block in (2048, 4096):  # the code predictor's and the talker's vocabularies, as sampling.py launches them
        compile_timed(block, K.sample_rows, sig, {"HAS_SEEN": True, "HAS_SUPPRESS": True, "BLOCK": block},
                      {"num_warps": min(max(block // 512, 1), 8), "enable_fp_fusion": False})
    """
)


def test_the_kernel_compiles_for_the_h200_in_seconds() -> None:
    """Both launch shapes compile for sm_90 within 60 s each with the Triton installed here. A search written as
    unrolled [2**DIGIT, BLOCK] rounds took the device image's Triton 3.6 over ten minutes (this box's 3.9: seconds,
    so this test passed it), and the server's start timed out on the GPU; check new kernels with Triton 3.6 too."""
    done = compiled_for_h200(COMPILE)
    assert [int(b) for b, _, _ in done] == [2048, 4096]
    assert all(float(s) < 60 and int(n) > 1000 for _, s, n in done), done
