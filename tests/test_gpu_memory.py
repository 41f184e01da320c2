"""`--gpu-memory-gib` off CUDA: refused in one line before the model loads (the cap itself needs a GPU: the lead's
bench_load run with `--gpu-memory-gib` is its check)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from models import registry
from models.common.config import ConfigError
from models.common.gpu_memory import kv_tokens
from tests.cli_run import run_cli


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["generate", "--text", "Hi."]])
def test_the_cap_is_refused_on_cpu_in_one_line(command):
    r = run_cli(*command, "--device", "cpu", "--gpu-memory-gib", "8")  # the CLI's own main, in this process
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--gpu-memory-gib" in lines[0] and "cpu" in lines[0] and "loaded" not in r.stderr, lines


def test_the_library_refuses_it_on_cpu_too():
    with pytest.raises(ValueError, match="caps CUDA memory"):
        registry.build_pipeline("tiny", "cpu", gpu_memory_gib=8)


def test_kv_memory_is_split_by_share_and_refused_below_a_useful_size():
    """Both models size their KV caches here: bytes a token from the decoder's layout and dtype, the talker's share
    of the thinker's tokens; too little memory is one clear error, not a cache of a few blocks."""
    thinker = SimpleNamespace(num_hidden_layers=48, num_key_value_heads=4, head_dim=128)  # 96 KiB a bf16 token
    talker = SimpleNamespace(num_hidden_layers=20, num_key_value_heads=2, head_dim=128)  # 20 KiB
    texts, share = {"thinker": thinker, "talker": talker}, {"thinker": 1.0, "talker": 0.25}
    tokens = kv_tokens(10.0, 12.0, "cpu", texts, torch.bfloat16, share)  # 10 GiB given: no device asked
    assert tokens["talker"] == int(tokens["thinker"] * 0.25)
    used = tokens["thinker"] * 96 * 1024 + tokens["talker"] * 20 * 1024
    assert 10 * 2**30 - (96 + 20) * 1024 <= used <= 10 * 2**30  # whole tokens of each
    with pytest.raises(ConfigError, match=r"0\.1 GiB leaves no room .* less 12 GiB"):
        kv_tokens(0.1, 12.0, "cpu", texts, torch.bfloat16, share)
