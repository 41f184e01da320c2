"""fused.align (a MoE's dispatch: token copies' stable order by expert and each expert's end) against torch's
argsort and searchsorted, on CPU under Triton's interpreter in a subprocess (TRITON_INTERPRET must be set before
triton is first imported). Decode-sized id counts around the kernel's block and chunk edges, experts left empty,
all copies on one expert, and an expert count that is not a power of two; and the kernel compiles for sm_90."""

from __future__ import annotations

import textwrap

import pytest
import torch

from models.common import fused
from tests.interpreted import compiled_for_h200, run_interpreted

pytestmark = pytest.mark.skipif(not fused.HAVE_TRITON, reason="triton is not installed")

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from models.common import fused

    g = torch.Generator().manual_seed(0)
    out = []
    for n, e, spread in [(1, 128, 128), (8, 128, 128), (63, 128, 4), (64, 128, 128), (65, 60, 60), (512, 128, 128),
                         (512, 128, 3), (1000, 128, 128), (1024, 128, 1), (16, 8, 8)]:
        ids = torch.randint(0, spread, (n,), generator=g) * (e // spread)  # spread < e: some experts stay empty
        got, want = fused.align_triton(ids, e), fused.align_torch(ids, e)
        out.append([n, e, spread, torch.equal(got[0], want[0]), torch.equal(got[1], want[1]), str(got[0].dtype),
                    str(got[1].dtype), int((got[1][1:] - got[1][:-1] == 0).sum())])
    print(json.dumps(out))
    """
)


def test_the_kernel_orders_and_ends_as_argsort_and_searchsorted() -> None:
    cases = run_interpreted(SCRIPT)
    assert len(cases) == 10
    for n, e, spread, order_equal, ends_equal, order_dtype, ends_dtype, _ in cases:
        assert order_equal and ends_equal, (n, e, spread)
        assert (order_dtype, ends_dtype) == ("torch.int64", "torch.int32")
    assert any(empty > 0 for *_, empty in cases)  # some cases leave experts without copies


def test_off_cuda_and_beyond_decode_sizes_align_is_torchs() -> None:
    ids = torch.randint(0, 16, (40,))
    order, ends = fused.align(ids, 16)
    assert torch.equal(order, ids.argsort(stable=True))
    assert torch.equal(ends, torch.bincount(ids, minlength=16).cumsum(0).to(torch.int32))


COMPILE = textwrap.dedent(
    """
    from models.common import fused, fused_kernels as K

    sig = {"ids_ptr": "*i64", "order_ptr": "*i64", "ends_ptr": "*i32", "n": "i32", "n_experts": "i32"}
    for block in (64, 1024):
        compile_timed(block, K._align, sig, {"BLOCK": block, "E_BLOCK": 128, "CHUNK": fused.ALIGN_CHUNK},
                      {"num_warps": 4})
    """
)


def test_the_kernel_compiles_for_the_h200_in_seconds() -> None:
    done = compiled_for_h200(COMPILE)
    assert [int(b) for b, _, _ in done] == [64, 1024]
    assert all(float(s) < 60 and int(n) > 1000 for _, s, n in done), done
