"""The checkpoint loader: the real layout from save_pretrained, shards, and clear errors."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.common.code2wav import Code2Wav
from models.common.weights import WeightError, map_name
from models.common.weights import load_weights as load_any
from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.model import load_model
from models.qwen3_omni.model import load_weights as load_omni
from models.qwen3_omni.tiny import FULL_CONFIG


def copy_ckpt(src, dst, edit=None):
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(src / "model.safetensors")
    if edit:
        edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_map_name_rules():
    t = map_name("model.layers.3.self_attn.k_proj.weight")
    assert (t.name, t.part) == ("model.layers.3.self_attn.qkv.weight", 1)
    t = map_name("model.layers.0.mlp.experts.7.up_proj.weight")
    assert (t.name, t.index, t.part) == ("model.layers.0.mlp.experts.w13", 7, 1)
    t = map_name("model.layers.0.mlp.experts.7.down_proj.weight")
    assert (t.name, t.index) == ("model.layers.0.mlp.experts.w2", 7)
    assert map_name("layers.0.mlp.shared_expert.gate_proj.weight").name == "layers.0.mlp.shared_expert.gate_up.weight"
    assert map_name("model.norm.weight").name == "model.norm.weight"


def test_loads_save_pretrained_layout(hf_tiny_a):
    ours = load_model(hf_tiny_a.path)
    ckpt = load_file(hf_tiny_a.path / "model.safetensors")  # the per-expert layout of real checkpoints
    sd = ours.state_dict()
    p = "thinker.model.layers.1."
    qkv = torch.cat([ckpt[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
    assert torch.equal(sd[p + "self_attn.qkv.weight"], qkv)
    e = p + "mlp.experts.3."
    gate_up = torch.cat([ckpt[e + "gate_proj.weight"], ckpt[e + "up_proj.weight"]])
    assert torch.equal(sd[p + "mlp.experts.w13"][3], gate_up)
    assert torch.equal(sd[p + "mlp.experts.w2"][3], ckpt[e + "down_proj.weight"])
    n_ckpt = sum(v.numel() for k, v in ckpt.items() if not k.startswith("thinker.visual."))
    assert sum(v.numel() for v in ours.parameters()) == n_ckpt
    assert all(v.device.type == "cpu" and v.dtype == torch.float32 for v in ours.parameters())


def test_sharded_checkpoint_with_index(hf_tiny_a, tmp_path):
    tensors = load_file(hf_tiny_a.path / "model.safetensors")
    keys = sorted(tensors)
    half = len(keys) // 2
    shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
    for fname, ks in shards.items():
        save_file({k: tensors[k] for k in ks}, tmp_path / fname)
    weight_map = {k: f for f, ks in shards.items() for k in ks}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(hf_tiny_a.path / "config.json", tmp_path / "config.json")
    a, b = load_model(tmp_path).state_dict(), load_model(hf_tiny_a.path).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightError, match="00002-of-00002"):
        load_model(tmp_path)


def test_missing_key(hf_tiny_a, tmp_path):
    path = copy_ckpt(hf_tiny_a.path, tmp_path / "c", lambda t: t.pop("talker.codec_head.weight"))
    with pytest.raises(WeightError, match=r"missing keys.*talker\.codec_head\.weight"):
        load_model(path)


def test_missing_one_expert_piece(hf_tiny_a, tmp_path):
    key = "thinker.model.layers.0.mlp.experts.3.up_proj.weight"
    path = copy_ckpt(hf_tiny_a.path, tmp_path / "c", lambda t: t.pop(key))
    with pytest.raises(WeightError, match=r"missing keys.*thinker\.model\.layers\.0\.mlp\.experts\.w13"):
        load_model(path)


def test_unexpected_key(hf_tiny_a, tmp_path):
    def add(t):
        t["talker.model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)

    path = copy_ckpt(hf_tiny_a.path, tmp_path / "c", add)
    with pytest.raises(WeightError, match=r"unexpected keys.*talker\.model\.layers\.0\.mlp\.extra_proj\.weight"):
        load_model(path)


def test_wrong_shape(hf_tiny_a, tmp_path):
    def reshape(t):
        t["code2wav.pre_transformer.norm.weight"] = torch.ones(7)

    path = copy_ckpt(hf_tiny_a.path, tmp_path / "c", reshape)
    with pytest.raises(WeightError, match=r"wrong shape.*code2wav\.pre_transformer\.norm\.weight.*\(7,\)"):
        load_model(path)


def test_vision_tower_is_skipped_and_dtype_is_the_callers(hf_tiny_a):
    keys = load_file(hf_tiny_a.path / "model.safetensors").keys()
    assert any(k.startswith("thinker.visual.") for k in keys)
    ours = load_model(hf_tiny_a.path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in ours.parameters())


def test_no_safetensors(tmp_path):
    shutil.copy(FULL_CONFIG, tmp_path / "config.json")
    with pytest.raises(WeightError, match="no safetensors"):
        load_model(tmp_path)


def test_a_models_own_names_through_the_rename_hook(hf_tiny_a, tmp_path):
    """Another model's checkpoint calls the codec `codec.*` and holds tensors we do not use: its rename hook
    maps the one and drops the other, and the shared loader fills the same Code2Wav."""

    def rename_codec(t):
        for k in [k for k in t if k.startswith("code2wav.")]:
            t["codec." + k.removeprefix("code2wav.")] = t.pop(k)
        t["speaker_encoder.proj.weight"] = torch.zeros(3, 3)

    path = copy_ckpt(hf_tiny_a.path, tmp_path / "c", rename_codec)
    cfg = OmniConfig.from_file(hf_tiny_a.path).code2wav
    ours, ref = Code2Wav(cfg), Code2Wav(cfg)
    load_any(ours, path, rename=lambda k: k.removeprefix("codec.") if k.startswith("codec.") else None)
    load_omni(ref, hf_tiny_a.path, prefix="code2wav.")
    a, b = ours.state_dict(), ref.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    keep_unknown = lambda k: k.removeprefix("codec.") if k.startswith("codec.") else (  # noqa: E731
        k if k.startswith("speaker_encoder.") else None)
    with pytest.raises(WeightError, match="unexpected keys.*speaker_encoder.proj.weight"):
        load_any(ours, path, rename=keep_unknown)
    with pytest.raises(WeightError) as many:  # every codec key unexpected: the message lists 20 and a count
        load_any(ours, path, rename=lambda k: None if k.startswith("thinker.") or k.startswith("talker.") else k)
    unexpected = str(many.value).split("unexpected keys")[1].split("\n")[0]
    assert unexpected.count("codec.") == 20 and "more" in unexpected and len(str(many.value)) < 8000
