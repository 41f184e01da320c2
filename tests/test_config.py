import copy
import json

import pytest

from models.qwen3_omni.config import ConfigError, OmniConfig
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config


def full_dict() -> dict:
    return json.loads(FULL_CONFIG.read_text())


def to_legacy(d: dict) -> dict:
    """The older hub layout: rope_theta at the sub-config's top level, mrope settings in rope_scaling."""
    d = copy.deepcopy(d)

    def walk(node: dict) -> None:
        rope = node.pop("rope_parameters", None)
        if rope is not None:
            node["rope_theta"] = rope["rope_theta"]
            if "mrope_section" in rope:
                node["rope_scaling"] = {
                    "type": "default",
                    "mrope_section": rope["mrope_section"],
                    "interleaved": rope.get("interleaved", False),
                }
        for v in node.values():
            if isinstance(v, dict):
                walk(v)

    walk(d)
    return d


def test_full_size_values_are_the_real_model():
    c = OmniConfig.from_hf(full_dict())
    t = c.thinker.text
    assert (t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (48, 32, 4, 128)
    assert (t.num_experts, t.num_experts_per_tok, t.norm_topk_prob) == (128, 8, True)
    assert t.mrope_section == (24, 20, 20) and t.mrope_interleaved and t.rope_theta == 1e6
    k = c.talker
    assert (k.text.num_experts_per_tok, k.text.shared_expert_intermediate_size) == (6, 768)
    assert (k.accept_hidden_layer, k.num_code_groups, k.code_predictor.num_hidden_layers) == (24, 16, 5)
    assert (k.codec_pad_id, k.codec_bos_id, k.codec_eos_id, k.codec_nothink_id) == (2148, 2149, 2150, 2155)
    assert k.speaker_id("Ethan") == 2302 and k.speaker_id("chelsie") == 2301
    assert c.thinker.audio_token_id == 151675 and c.thinker.audio.output_dim == 2048
    assert (c.system_token_id, c.user_token_id, c.assistant_token_id) == (8948, 872, 77091)
    assert (c.tts_pad_token_id, c.tts_bos_token_id, c.tts_eos_token_id) == (151671, 151672, 151673)
    assert c.code2wav.samples_per_frame == 1920 and c.code2wav.sliding_window == 72


def test_legacy_hub_form_parses_to_the_same_config():
    assert OmniConfig.from_hf(to_legacy(full_dict())) == OmniConfig.from_hf(full_dict())


def test_num_local_experts_alias():
    d = full_dict()
    tc = d["talker_config"]["text_config"]
    tc["num_local_experts"] = tc.pop("num_experts")
    assert OmniConfig.from_hf(d).talker.text.num_experts == 128


@pytest.mark.parametrize(
    "path",
    [
        ("thinker_config", "text_config", "head_dim"),
        ("talker_config", "accept_hidden_layer"),
        ("talker_config", "text_config", "num_experts_per_tok"),
        ("code2wav_config", "sliding_window"),
        ("tts_pad_token_id",),
    ],
)
def test_missing_required_key_is_named(path):
    d = full_dict()
    node = d
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]
    with pytest.raises(ConfigError, match=path[-1]):
        OmniConfig.from_hf(d)


def test_unspecified_unsafe_unsupported_and_inconsistent_values_are_rejected():
    d = full_dict()
    d["talker_config"]["speaker_id"] = {"ethan": 2302}
    with pytest.raises(ConfigError, match="unknown speaker"):
        OmniConfig.from_hf(d).talker.speaker_id("aiden")
    d = full_dict()
    d["talker_config"]["thinker_hidden_size"] = 1024
    with pytest.raises(ConfigError, match="thinker_hidden_size"):
        OmniConfig.from_hf(d)
    d = full_dict()
    d["thinker_config"]["text_config"]["rope_parameters"]["mrope_section"] = [24, 20, 10]
    with pytest.raises(ConfigError, match="mrope_section"):
        OmniConfig.from_hf(d)


@pytest.mark.parametrize("variant", ["a", "b"])
def test_tiny_configs_parse(variant):
    c = OmniConfig.from_hf(tiny_config(variant))
    assert c.thinker.text.hidden_size == c.talker.thinker_hidden_size
    assert c.code2wav.samples_per_frame == 1920


def test_from_file_missing(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        OmniConfig.from_file(tmp_path)
