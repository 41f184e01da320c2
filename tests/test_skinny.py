"""models/common/skinny.py's kernel (x @ w.T for a few rows) against float64, on CPU under Triton's interpreter in a
subprocess (TRITON_INTERPRET must be set before triton is first imported). The interpreter's bfloat16 matmul is
not the GPU's, so float32 and float16 are checked here; benchmarks/check_skinny.py checks bfloat16 on the GPU."""

from __future__ import annotations

import textwrap
import threading

import pytest
import torch
import torch.nn.functional as F

from models.common import skinny
from models.common.layers import Linear
from pipelines import fastest
from tests.interpreted import run_interpreted

pytestmark = pytest.mark.skipif(not skinny.HAVE_TRITON, reason="triton is not installed")

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from models.common import skinny

    torch.manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.float16):
        for m, n, k in [(1, 96, 64), (3, 100, 272), (16, 64, 512), (40, 48, 96)]:  # ragged N and K tiles
            x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
            want = x.double() @ w.double().T
            for cfg in skinny.CONFIGS:
                got = skinny.skinny_mm(x, w, *cfg)
                err = ((got.double() - want).abs().max() / want.abs().max()).item()
                out.append([str(dtype), [m, n, k], list(cfg), str(got.dtype), list(got.shape), err])
    print(json.dumps(out))
    """
)


def test_the_kernel_matches_float64_in_every_config():
    cases = run_interpreted(SCRIPT)
    assert len(cases) == 2 * 4 * len(skinny.CONFIGS)
    for dtype, (m, n, k), cfg, got_dtype, shape, err in cases:
        assert got_dtype == dtype and shape == [m, n], (dtype, m, n, k, cfg)
        assert err < (1e-6 if dtype == "torch.float32" else 2e-3), (dtype, m, n, k, cfg, err)


def test_off_cuda_the_layer_is_f_linear():
    torch.manual_seed(0)
    layer = Linear(64, 32, bias=False).to(torch.bfloat16)
    x = torch.randn(2, 1, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert not skinny.usable(x, layer.weight)
        assert torch.equal(layer(x), F.linear(x, layer.weight))


def test_an_untimed_shape_outside_a_warm_up_takes_the_first_way_untimed():
    """A live step never stops to time ways (or compile the kernels they launch): only a graph runner's warm-up,
    `fastest.warming_up()`, times; the flag is per thread and restored on leaving, nested or not."""
    built = []

    def ways():
        built.append(1)
        return [lambda: torch.zeros(1)]

    assert fastest.fastest(("test", "untimed"), ways) == 0
    assert not built and ("test", "untimed") not in fastest._CHOICE
    with fastest.warming_up():
        with fastest.warming_up():
            assert fastest._LOCAL.on
        assert fastest._LOCAL.on
        seen = []
        other = threading.Thread(target=lambda: seen.append(getattr(fastest._LOCAL, "on", False)))
        other.start(), other.join()
        assert seen == [False]
    assert not fastest._LOCAL.on
