import pytest
import torch

from models.common import layers
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
