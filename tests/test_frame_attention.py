"""fused.frame_attention_triton (the code predictor's per-frame attention, models/common/code_predictor.py's
FrameKVCache on CUDA) against float64 attention, on CPU under Triton's interpreter in a subprocess: a frame's 15
steps (2 positions, then 1 each) with grouped heads, q, k, v as views of a fused qkv or, as served, q and k
copies beside v's view; the buffers must hold every step's keys and values where the torch path puts them."""

from __future__ import annotations

import textwrap

import pytest

from models.common import fused
from tests.interpreted import run_interpreted

pytestmark = pytest.mark.skipif(not fused.HAVE_TRITON, reason="triton is not installed")

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from models.common import fused

    torch.manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.float16):
        for b, hq, hkv, d, p in [(1, 4, 2, 32, 16), (3, 2, 2, 16, 16), (2, 6, 2, 16, 12)]:
            kb, vb = torch.zeros(b, p, hkv, d, dtype=dtype), torch.zeros(b, p, hkv, d, dtype=dtype)
            keys, vals = [], []
            past, worst = 0, 0.0
            for step in range(p - 1):
                t = 2 if step == 0 else 1
                qkv = torch.randn(b, t, (hq + 2 * hkv) * d).to(dtype)
                q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
                q, k, v = q.view(b, t, hq, d), k.view(b, t, hkv, d), v.view(b, t, hkv, d)
                if step % 2:  # q and k normed and rotated into tensors of their own, v still a view (as served)
                    q, k = q.contiguous(), k.contiguous()
                got = fused.frame_attention_triton(q, k, v, kb, vb, past, d**-0.5)
                keys.append(k), vals.append(v)
                kk, vv = torch.cat(keys, 1).double(), torch.cat(vals, 1).double()
                kk, vv = kk.repeat_interleave(hq // hkv, 2), vv.repeat_interleave(hq // hkv, 2)
                s = torch.einsum("bthd,bshd->bhts", q.double(), kk) * d**-0.5
                mask = torch.arange(past + t)[None, :] <= (torch.arange(t)[:, None] + past)
                want = torch.einsum("bhts,bshd->bthd", s.masked_fill(~mask, float("-inf")).softmax(-1), vv)
                worst = max(worst, ((got.double() - want).abs().max() / want.abs().max()).item())
                past += t
            stored = torch.equal(kb[:, :past], torch.cat(keys, 1)) and torch.equal(vb[:, :past], torch.cat(vals, 1))
            out.append([str(dtype), [b, hq, hkv, d, p], worst, stored, list(got.shape), str(got.dtype)])
    print(json.dumps(out))
    """
)


def test_a_frames_steps_attend_and_store_as_the_reference():
    cases = run_interpreted(SCRIPT)
    assert len(cases) == 6
    for dtype, (b, hq, hkv, d, p), worst, stored, shape, out_dtype in cases:
        assert stored, (dtype, b, hq, hkv, d, p)
        assert shape == [b, 1, hq, d] and out_dtype == dtype
        assert worst < (1e-5 if dtype == "torch.float32" else 2e-3), (dtype, b, hq, hkv, d, p, worst)
