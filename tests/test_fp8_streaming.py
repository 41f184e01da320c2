"""fp8 experts made as the weights load: `load_model(..., quantization="fp8")` quantizes each expert tensor as it
is read and `random_model(..., quantization="fp8")` each stacked expert weight as it is made. The result is the
same fp8 bytes and scales as loading in the model's dtype and then `fp8_experts_`, and no full-precision copy
of the experts is ever held: measured with torch.profiler's CPU memory timeline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action

from models.common import fp8
from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.model import load_model, random_model
from models.qwen3_omni.tiny import thinker_only, tiny_config


def same_state(a: torch.nn.Module, b: torch.nn.Module) -> int:
    """Asserts equal state dicts (fp8 tensors byte for byte); returns how many fp8 tensors there are."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name, x in sa.items():
        y = sb[name]
        assert x.dtype == y.dtype, name
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)) if x.dtype == fp8.FP8 else torch.equal(x, y), name
    return sum(x.dtype == fp8.FP8 for x in sa.values())


def quantized_after(load) -> torch.nn.Module:
    """Today's other path: the model whole in its dtype, then its experts quantized."""
    model = load()
    fp8.fp8_experts_(model)
    return model


def big_experts_config() -> dict:
    """A thinker whose experts outweigh its other matrices (16 experts of 256 x 128, blocks without padding), so
    that a full-precision copy of a stacked expert weight stands out of what loading holds."""
    c = thinker_only(tiny_config("a"))
    th = c["thinker_config"]
    th["text_config"].update(hidden_size=128, num_hidden_layers=2, num_experts=16, moe_intermediate_size=256)
    th["audio_config"]["output_dim"] = th["vision_config"]["out_hidden_size"] = 128
    return c


@pytest.fixture(scope="module")
def big_experts(tmp_path_factory) -> dict[str, Path]:
    """The big-experts model in bf16, saved twice: one tensor per expert and projection (the published layout),
    and with each layer's experts stacked (w13, w2 in one tensor each)."""
    config = big_experts_config()
    model = random_model(OmniConfig.from_hf(config), "cpu", torch.bfloat16)
    stacked = {name: p.detach().contiguous() for name, p in model.named_parameters()}
    per_expert = {}
    for name, w in stacked.items():
        head, _, leaf = name.rpartition(".")
        if leaf not in fp8.PIECES:
            per_expert[name] = w
            continue
        for e, we in enumerate(w):
            pieces = zip(("gate_proj", "up_proj"), we.chunk(2), strict=True) if leaf == "w13" else [("down_proj", we)]
            per_expert.update({f"{head}.{e}.{p}.weight": x.contiguous() for p, x in pieces})
    paths = {}
    for layout, tensors in (("per_expert", per_expert), ("stacked", stacked)):
        path = paths[layout] = tmp_path_factory.mktemp(layout)
        (path / "config.json").write_text(json.dumps(config))
        save_file(tensors, path / "model.safetensors")
    return paths


@pytest.mark.parametrize("layout", ["per_expert", "stacked"])
def test_streamed_fp8_equals_loading_then_quantizing(big_experts, layout):
    path = big_experts[layout]
    streamed = load_model(path, dtype=torch.bfloat16, quantization="fp8")
    assert same_state(streamed, quantized_after(lambda: load_model(path, dtype=torch.bfloat16))) == 2 * 2


def test_streamed_fp8_equals_loading_then_quantizing_a_transformers_checkpoint(hf_tiny_a):
    """A float32 checkpoint (the thinker's and talker's experts) rounded to bf16 on the way, in both paths."""
    streamed = load_model(hf_tiny_a.path, dtype=torch.bfloat16, quantization="fp8")
    assert same_state(streamed, quantized_after(lambda: load_model(hf_tiny_a.path, dtype=torch.bfloat16))) == 12


def test_an_fp8_checkpoint_in_other_blocks_is_requantized_as_today(hf_tiny_a, tmp_path):
    """Blocks other than 128x128 load dequantized by default; with quantization "fp8" the experts are quantized
    from that dequantized value, as loading it and then `fp8_experts_` does."""
    tensors = {}
    for key, w in load_file(hf_tiny_a.path / "model.safetensors").items():
        if ".experts." in key:
            tensors[key], tensors[key + fp8.SCALE] = fp8.quantize(w, (16, 24))
        else:
            tensors[key] = w
    path = tmp_path / "fp8_16x24"
    shutil.copytree(hf_tiny_a.path, path)
    save_file(tensors, path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [16, 24]}
    (path / "config.json").write_text(json.dumps(config))
    assert not any(v.dtype == fp8.FP8 for v in load_model(path).state_dict().values())
    streamed = load_model(path, dtype=torch.bfloat16, quantization="fp8")
    assert same_state(streamed, quantized_after(lambda: load_model(path, dtype=torch.bfloat16))) == 12


def test_random_fp8_equals_random_then_quantizing():
    cfg = OmniConfig.from_hf(tiny_config("a"))
    made = random_model(cfg, "cpu", torch.bfloat16, quantization="fp8")
    assert same_state(made, quantized_after(lambda: random_model(cfg, "cpu", torch.bfloat16))) == 12


def held_beyond_kept(make) -> int:
    """Runs make() under torch.profiler's memory profiling: the most CPU bytes it held at once beyond those it still
    holds at the end (the peak of allocations less frees, over their sum at the end)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as p:
        kept = make()
    live = peak = 0
    for _, action, _, size in p._memory_profile().timeline:
        live += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, live)
    del kept
    return peak - live


@pytest.mark.parametrize("how", ["load", "random"])
def test_fp8_experts_are_never_held_in_full_precision(big_experts, how):
    """Beyond what it keeps, a load holds the checkpoint's mapping and one tensor's transients (random weights:
    the values of the tensor being made). Streaming the experts into fp8 adds less than the smallest stacked
    expert weight in bf16 to that (one expert's quantization scratch); loading in bf16 and then quantizing holds
    every expert in bf16 at once, and the same measure shows it."""
    path = big_experts["per_expert"]
    cfg = OmniConfig.from_hf(big_experts_config())
    if how == "load":
        def make(quantization=None):
            return load_model(path, dtype=torch.bfloat16, quantization=quantization)
    else:
        def make(quantization=None):
            return random_model(cfg, "cpu", torch.bfloat16, quantization=quantization)
    experts = [p for n, p in make().named_parameters() if n.rsplit(".", 1)[-1] in fp8.PIECES]
    one = min(p.nbytes for p in experts)
    plain = held_beyond_kept(make)
    streamed = held_beyond_kept(lambda: make("fp8"))
    after = held_beyond_kept(lambda: quantized_after(make))
    assert len(experts) == 4 and one >= 2**20
    assert streamed < plain + one, (plain, streamed, one)
    assert after > streamed + one, (after, streamed, one)
