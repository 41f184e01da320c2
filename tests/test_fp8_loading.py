"""fp8 weights. A checkpoint in the layout of Qwen's FP8 releases (float8_e4m3fn `X.weight`, float32
`X.weight_scale_inv` block scales, config.json's quantization_config) loads exactly to what was quantized: its
MoE experts kept in fp8 as stored (128x128 blocks), the rest dequantized into the model's dtype; what we do not
read is refused naming the field or the tensor. `--quantization fp8` rounds a model's MoE experts to the same
layout (test_fp8_streaming.py: as they load)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from models import registry
from models.common import fp8, fp8_moe
from models.common.config import ConfigError
from models.common.weights import WeightError
from models.qwen3_omni.model import load_model
from models.qwen3_omni.placement import PipelineConfig
from models.qwen3_omni.program import build_pipeline
from pipelines.types import AudioChunk, GenerationOptions, Message, Turn, TurnDone
from tests.cli_run import run_cli

QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
         "modules_to_not_convert": ["thinker.lm_head", "mlp.gate"]}


def expand(scale: torch.Tensor, rows: int, cols: int, block: tuple[int, int]) -> torch.Tensor:
    """Each block's scale over its (b0 x b1) elements, cropped to the weight (written apart from fp8.py's)."""
    return torch.kron(scale, torch.ones(block))[:rows, :cols]


def quantized_key(key: str, t: torch.Tensor) -> bool:
    """The Linear weights quantized: every projection (attention, experts, shared and dense MLPs, and the
    audio encoder's, talker's and Code2Wav's), not embeddings, norms, routers or heads."""
    return t.dim() == 2 and key.endswith("_proj.weight")


def write(src: Path, dst: Path, tensors: dict[str, torch.Tensor], quant: dict | None, split: bool = False) -> Path:
    """A checkpoint directory: src's other files, config.json with `quant` (or none), and `tensors`; `split`:
    in two shards named by an index, the scales in the second, apart from their weights."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    if quant is not None:
        config["quantization_config"] = quant
    (dst / "config.json").write_text(json.dumps(config))
    if not split:
        save_file(tensors, dst / "model.safetensors")
        return dst
    parts = [[k for k in tensors if not k.endswith(fp8.SCALE)], [k for k in tensors if k.endswith(fp8.SCALE)]]
    weight_map = {}
    for i, part in enumerate(parts):
        name = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        save_file({k: tensors[k] for k in part}, dst / name)
        weight_map.update(dict.fromkeys(part, name))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return dst


@pytest.fixture(scope="module", params=[(128, 128), (16, 24)], ids=["128x128", "16x24"])
def fp8_ckpt(request, hf_tiny_a, tmp_path_factory) -> tuple[Path, Path, tuple[int, int]]:
    """(the fp8 checkpoint, the same with each quantized weight stored as its float32 dequantized value, block):
    Qwen's 128x128 blocks (one block per tiny weight), and blocks with partial edges in both dimensions."""
    block = request.param
    tmp = tmp_path_factory.mktemp(f"fp8_{block[0]}x{block[1]}")
    original = load_file(hf_tiny_a.path / "model.safetensors")
    quantized, dequantized = dict(original), dict(original)
    for key, w in original.items():
        if quantized_key(key, w):
            q, scale = fp8.quantize(w, block)
            assert q.dtype == torch.float8_e4m3fn and scale.shape == fp8.scale_shape(w.shape, block)
            quantized[key], quantized[key + fp8.SCALE] = q, scale
            deq = q.float() * expand(scale, *w.shape, block)
            # within fp8 e4m3's rounding: half a step of 3 mantissa bits, or of a subnormal (2^-9) step
            assert ((deq - w).abs() <= w.abs() / 16 + expand(scale, *w.shape, block) / 2**10).all(), key
            dequantized[key] = deq
    assert sum(k.endswith(fp8.SCALE) for k in quantized) > 100  # attention, experts, talker, Code2Wav ...
    quant = {**QUANT, "weight_block_size": list(block)}
    return write(hf_tiny_a.path, tmp / "fp8", quantized, quant, split=True), write(hf_tiny_a.path, tmp / "ref",
                                                                                   dequantized, None), block


def stored_experts(path: Path, name: str, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert `e` of the stacked `name` (w13: gate then up; w2: down) as the checkpoint stores it: fp8, scales."""
    stored = {}
    for f in path.glob("*.safetensors"):
        stored.update(load_file(f))
    head, leaf = name.rsplit(".", 1)
    keys = [f"{head}.{e}.{p}.weight" for p in (("gate_proj", "up_proj") if leaf == "w13" else ("down_proj",))]
    return torch.cat([stored[k] for k in keys]), torch.cat([stored[k + fp8.SCALE] for k in keys])


def test_fp8_checkpoint_loads_to_exactly_what_was_quantized(fp8_ckpt, hf_tiny_a):
    """Every weight equals what was quantized; in Qwen's 128x128 blocks the MoE experts stay fp8 (by default: they
    are fp8 already), their bytes and scales as stored; other blocks and other weights load dequantized."""
    path, ref, block = fp8_ckpt
    loaded = load_model(path).state_dict()
    ours = dict(loaded)
    expected = load_model(ref).state_dict()
    original = load_model(hf_tiny_a.path).state_dict()
    kept = [n for n, v in ours.items() if v.dtype == fp8.FP8]
    assert len(kept) == (2 * (4 + 2) if block == fp8.BLOCK else 0)  # the thinker's and talker's MoE layers
    for name in kept:
        for e in range(ours[name].shape[0]):
            q, scale = stored_experts(path, name, e)
            assert torch.equal(ours[name][e].view(torch.uint8), q.view(torch.uint8)), (name, e)
            assert torch.equal(ours[name + fp8.SCALE][e], scale), (name, e)
        w, scale = ours[name], ours.pop(name + fp8.SCALE)
        ours[name] = fp8_moe.dequantize_split(w, scale, w.shape[1] // 2 if name.endswith("w13") else None)
    assert ours.keys() == expected.keys() == original.keys()
    changed = 0
    for name, value in ours.items():
        assert value.dtype == torch.float32 and torch.equal(value, expected[name]), name
        if not torch.equal(value, original[name]):
            changed += 1
            err = (value - original[name]).norm() / original[name].norm()
            assert 0 < err < 0.05, (name, float(err))  # fp8 e4m3: ~2-3% relative error
    assert changed >= sum(1 for n in ours if n.endswith(("qkv.weight", "w13", "w2", "o_proj.weight")))
    bf16 = load_model(path, dtype=torch.bfloat16).state_dict()  # the experts alike, the rest rounded to bf16
    assert bf16.keys() == loaded.keys()
    for n, value in bf16.items():
        want = loaded[n] if n in kept or n.endswith(fp8.SCALE) else expected[n].to(torch.bfloat16)
        assert value.dtype == want.dtype and torch.equal(value.view(torch.uint8), want.view(torch.uint8)), n


def test_a_turn_runs_on_the_fp8_checkpoint(fp8_ckpt):
    """A greedy spoken turn on the fp8 checkpoint equals the one on its dequantized float32 twin."""
    path, ref, _ = fp8_ckpt
    audio = torch.randn(16000, generator=torch.Generator().manual_seed(3)) * 0.1
    turn = Turn("s", [Message("user", "Hello!", audio)], GenerationOptions(greedy=True, max_text_tokens=5,
                                                                          max_frames=4))
    runs = []
    for model in (path, ref):
        with build_pipeline(PipelineConfig(model=str(model))) as p:
            runs.append(p.run(turn, timeout_s=300))
    (fp8_events, ref_events) = runs
    done, ref_done = fp8_events[-1], ref_events[-1]
    assert isinstance(done, TurnDone) and isinstance(ref_done, TurnDone), (done, ref_done)
    assert done.text_ids == ref_done.text_ids and len(done.text_ids) > 0
    assert done.codes == ref_done.codes and len(done.codes) > 0
    pcm = [np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)]) for events in runs]
    assert len(pcm[0]) > 0
    np.testing.assert_array_equal(pcm[0], pcm[1])


def edit_config(path: Path, **quant) -> None:
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {**config["quantization_config"], **quant}
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(("field", "value"), [("quant_method", "gptq"), ("fmt", "e5m2"),
                                              ("activation_scheme", "static"), ("weight_block_size", [128])])
def test_a_quantization_we_do_not_read_is_refused_naming_the_field(fp8_ckpt, tmp_path, field, value):
    path, _, _ = fp8_ckpt
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    edit_config(bad, **{field: value})
    with pytest.raises(ConfigError) as e:
        load_model(bad)
    assert field in str(e.value) and str(value) in str(e.value), e.value
    with pytest.raises(ValueError) as e:  # the server's path: one line, before any weight is read
        registry.build_pipeline(str(bad))
    assert field in str(e.value) and "\n" not in str(e.value), e.value


KEY = "thinker.model.layers.1.mlp.experts.3.down_proj.weight"


def break_tensors(name: str, t: dict[str, torch.Tensor]) -> str:
    """Break the fp8 checkpoint's tensors one way; returns what the error must name."""
    if name == "missing scale":
        del t[KEY + fp8.SCALE]
        return KEY + fp8.SCALE
    if name == "scale shape":
        t[KEY + fp8.SCALE] = torch.ones(2, 2)
        return KEY + fp8.SCALE
    if name == "scaled bf16":
        t[KEY] = t[KEY].to(torch.bfloat16)
        return KEY
    t[KEY] = t[KEY].float().to(torch.float8_e5m2)  # "e5m2 weight"
    return KEY


@pytest.mark.parametrize("broken", ["missing scale", "scale shape", "scaled bf16", "e5m2 weight", "no config"])
def test_a_broken_fp8_tensor_is_refused_naming_it(fp8_ckpt, tmp_path, broken):
    path, _, _ = fp8_ckpt
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(f))
    named = "has no quantization_config" if broken == "no config" else break_tensors(broken, tensors)
    write(path, tmp_path / "bad", tensors, None if broken == "no config" else json.loads(
        (path / "config.json").read_text())["quantization_config"])
    with pytest.raises(WeightError) as e:
        load_model(tmp_path / "bad")
    assert named in str(e.value), e.value


def test_quantize_round_trip_within_fp8_precision():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 200, 300, generator=g) * torch.logspace(-6, 2, 300)  # a wide range of magnitudes
    w[1, :128, 128:256] = 0  # an all-zero block
    q, scale = fp8.quantize(w)
    assert q.shape == w.shape and scale.shape == (3, 2, 3) and scale[1, 0, 1] == 1
    s = torch.stack([expand(scale[i], 200, 300, (128, 128)) for i in range(3)])
    deq = fp8.dequantize(q, scale, (128, 128))
    assert torch.equal(deq, q.float() * s) and (deq[1, :128, 128:256] == 0).all()
    assert ((deq - w).abs() <= w.abs() / 16 + s / 2**10).all()
    for r in range(0, 200, 128):  # each block's largest magnitude maps to 448 and back
        for c in range(0, 300, 128):
            amax = w[:, r : r + 128, c : c + 128].abs().amax((1, 2))
            assert torch.allclose(deq[:, r : r + 128, c : c + 128].abs().amax((1, 2)), amax, rtol=1e-6)


def test_quantization_flag_rounds_the_experts_only():
    """--quantization fp8 on bf16 weights: each expert's gate, up and down, in 128x128 blocks of its own,
    becomes its fp8 value (within fp8's error of the bf16 one), held as fp8 bytes and float32 scales; every
    other weight is untouched."""
    plain = load_model("tiny", dtype=torch.bfloat16)
    model = load_model("tiny", dtype=torch.bfloat16)
    fp8.fp8_experts_(model)
    before, after = plain.state_dict(), model.state_dict()
    experts = [n for n in before if n.endswith((".experts.w13", ".experts.w2"))]
    assert len(experts) == 2 * (4 + 2)  # the thinker's 4 MoE layers and the talker's 2
    assert after.keys() == before.keys() | {n + fp8.SCALE for n in experts}
    for name, w in before.items():
        if name not in experts:
            assert torch.equal(after[name], w), name
            continue
        pieces = w.float().unflatten(1, (2, -1)) if name.endswith("w13") else w.float()[:, None]
        expected, scales, raw = [], [], []
        for piece in pieces.flatten(0, 1):
            q, scale = fp8.quantize(piece)
            raw.append(scale)
            scales.append(expand(scale, *piece.shape, (128, 128)))
            expected.append(q.float() * scales[-1])
        expected, scales = torch.stack(expected).view(w.shape), torch.stack(scales).view(w.shape)
        assert after[name].dtype == fp8.FP8 and torch.equal(after[name].float() * scales, expected), name
        assert torch.equal(after[name + fp8.SCALE], torch.stack(raw).view(w.shape[0], -1, raw[0].shape[-1])), name
        assert not torch.equal(expected.to(torch.bfloat16), w)
        assert ((expected - w.float()).abs() <= w.float().abs() / 16 + scales / 2**10).all(), name


def test_quantization_flag_generates_from_the_cli(tmp_path):
    cli = ["generate", "--device", "cpu", "--quantization", "fp8"]  # the CLI's own main, in this process
    out = run_cli(*cli, "--model", "tiny", "--text", "Hello!", "--greedy", "--max-text-tokens", "4", "--max-frames",
                  "3", "--out", str(tmp_path / "out.wav"), "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["text_ids"] and result["codes"] and (tmp_path / "out.wav").stat().st_size > 44
    refused = run_cli(*cli, "--model", "tiny-tts", "--text", "Hi.", timeout=300)
    assert refused.returncode != 0 and "has none" in refused.stderr and "Traceback" not in refused.stderr
