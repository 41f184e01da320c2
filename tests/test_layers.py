import pytest
import torch

from models.common import fp8, fused, layers
from models.common.layers import MoE


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without grouped matmul")
def test_grouped_experts_equal_the_per_expert_loop(monkeypatch):
    torch.manual_seed(0)
    moe = MoE(hidden=32, num_experts=8, top_k=3, intermediate=16, norm_topk=True, shared=24)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 37, 32)
    loop = moe(x)
    monkeypatch.setattr(layers, "USE_GROUPED_ON_CPU", True)
    assert moe.experts.grouped(x)
    grouped = moe(x)
    torch.testing.assert_close(grouped, loop, rtol=1e-5, atol=1e-5)
    one = moe(x[:1, :1])  # most experts get no token: empty groups
    monkeypatch.setattr(layers, "USE_GROUPED_ON_CPU", False)
    torch.testing.assert_close(one, moe(x[:1, :1]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("way", ["loop", "grouped", "fp8"])
def test_padding_tokens_go_to_no_expert_and_leave_the_real_ones_as_they_were(monkeypatch, way):
    """KVCache.pad: a fixed-shape prefill's padding tokens are routed to no expert (so the grouped kernels skip
    them) and get 0 from the experts, even when they hold NaN; every real token's output is the one it gets
    without them (up to the dense matmuls' blocking at another row count). The shared expert (dense) still runs on
    every token."""
    torch.manual_seed(0)
    moe = MoE(hidden=128, num_experts=8, top_k=3, intermediate=128, norm_topk=True, shared=24)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    if way == "fp8":
        fp8.fp8_experts_(moe)
    monkeypatch.setattr(layers, "USE_GROUPED_ON_CPU", way == "grouped" and hasattr(torch, "_grouped_mm"))
    x = torch.randn(3, 8, 128)
    pad = torch.zeros(3, 8, dtype=torch.bool)
    pad[0, 5:], pad[1, 2:], pad[2] = True, True, True  # rows of 5 and 2 real tokens, and a padding row
    x[pad] = float("nan")
    seen = []
    align = fused.align
    monkeypatch.setattr(fused, "align", lambda ids, n: seen.append(align(ids, n)) or seen[-1])
    with torch.inference_mode():
        out = moe(x, pad.reshape(-1))
        alone = moe(x[~pad][None])
    order, ends = seen[0]
    assert int(ends[-1]) == 7 * 3 and order.numel() == 24 * 3  # 7 real tokens' copies in the experts' rows
    routed = moe.experts(x.reshape(-1, 128)[pad.reshape(-1)], torch.zeros(17, 3, dtype=torch.long),
                         torch.ones(17, 3))  # what the padding tokens' rows would cost: NaN in, NaN out
    assert routed.isnan().all()
    shared = torch.sigmoid(moe.shared_expert_gate(x[pad])) * moe.shared_expert(x[pad])
    torch.testing.assert_close(out.reshape(-1, 128)[~pad.reshape(-1)], alone[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(out[pad].isnan(), shared.isnan())  # routed 0 + the shared expert's (NaN in: NaN out)
