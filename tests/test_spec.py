"""The model contract's declarations: ModelSpec, a turn's settings resolved against it, and the
checkpoint's generation_config.json routed to stages the way transformers' generate routes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.qwen3_omni.config import ConfigError, OmniConfig
from models.qwen3_omni.spec import DEFAULTS, TurnSettings, checkpoint_sampling, omni_spec
from models.qwen3_omni.tiny import thinker_only, tiny_config
from pipelines.sampling import SamplingParams
from pipelines.spec import ModelSpec
from pipelines.types import GenerationOptions


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return omni_spec(OmniConfig.from_hf(tiny_config("a")), "tiny")


def test_omni_declares_what_realtime_needs(spec: ModelSpec):
    assert (spec.input_rate, spec.output_rate, spec.frame_samples) == (16000, 24000, 1920)
    assert spec.frame_ms == 80.0
    assert set(spec.voices) == {"ethan", "chelsie", "aiden"} and spec.default_voice == "ethan"
    assert spec.speaks and spec.hears and spec.transcribes and spec.tools
    caps = spec.capabilities()
    assert caps["audio_out"] and caps["voices"] == list(spec.voices) and caps["output_rate"] == 24000


def test_thinker_only_checkpoint_declares_text_out():
    spec = omni_spec(OmniConfig.from_hf(thinker_only(tiny_config("a"))), "tiny-thinker")
    assert not spec.speaks and spec.hears and spec.voices == () and spec.output_rate == 0
    assert set(spec.sampling) == {"thinker"}
    with pytest.raises(ValueError, match="text only"):
        TurnSettings.resolve(GenerationOptions(audio=True), spec)
    assert TurnSettings.resolve(GenerationOptions(audio=False), spec).speaker == ""


def test_voices_resolve_in_any_case_and_unknown_ones_fail(spec: ModelSpec):
    assert spec.voice("") == "ethan" and spec.voice("Chelsie") == "chelsie"
    with pytest.raises(ValueError, match="unknown voice 'bob'"):
        spec.voice("bob")
    assert TurnSettings.resolve(GenerationOptions(voice="AIDEN"), spec).speaker == "aiden"


def test_spec_refuses_inconsistent_declarations():
    with pytest.raises(ValueError, match="frame length and voices"):
        ModelSpec("m", "x", output_rate=24000)
    with pytest.raises(ValueError, match="default voice"):
        ModelSpec("m", "x", output_rate=24000, frame_samples=1920, voices=("a",), default_voice="b")


def test_settings_take_overrides_per_stage_and_greedy_everywhere(spec: ModelSpec):
    s = TurnSettings.resolve(GenerationOptions(), spec)
    assert (s.thinker, s.talker, s.predictor) == (DEFAULTS["thinker"], DEFAULTS["talker"], DEFAULTS["predictor"])
    hot = SamplingParams(temperature=1.3, top_k=5)
    s = TurnSettings.resolve(GenerationOptions(sampling={"talker": hot}), spec)
    assert s.talker == hot and s.predictor == DEFAULTS["predictor"]
    g = TurnSettings.resolve(GenerationOptions(greedy=True, sampling={"talker": hot}), spec)
    assert g.thinker.greedy and g.predictor.greedy and g.talker.greedy
    assert g.talker.repetition_penalty == hot.repetition_penalty  # the reference's greedy keeps the penalty


def test_clone_requests_are_refused_by_a_model_that_cannot_clone(spec: ModelSpec):
    import torch

    with pytest.raises(ValueError, match="clone"):
        TurnSettings.resolve(GenerationOptions(reference_audio=torch.zeros(16000)), spec)


def test_generation_config_routes_prefixed_keys_to_their_stage(tmp_path: Path):
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.1,  # the wrapper's own keys: reach neither stage
        "thinker_do_sample": True, "thinker_temperature": 0.7, "thinker_top_p": 0.8, "thinker_top_k": 20,
        "talker_temperature": 0.6,
    }))
    thinker = checkpoint_sampling(str(tmp_path), "thinker", DEFAULTS["thinker"])
    assert thinker == SamplingParams(temperature=0.7, top_k=20, top_p=0.8)
    talker = checkpoint_sampling(str(tmp_path), "talker", DEFAULTS["talker"])
    assert talker.temperature == 0.6 and talker.top_k == 50 and talker.repetition_penalty == 1.05
    assert checkpoint_sampling(str(tmp_path), "predictor", DEFAULTS["predictor"]) == DEFAULTS["predictor"]
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.1}))
    assert checkpoint_sampling(str(tmp_path), "thinker", DEFAULTS["thinker"]).greedy


def test_quantized_checkpoint_is_refused_in_one_line():
    d = tiny_config("a") | {"quantization_config": {"quant_method": "gptq", "bits": 4}}  # fp8: test_fp8_loading
    with pytest.raises(ConfigError) as e:
        OmniConfig.from_hf(d)
    assert "quant_method 'gptq' is not supported" in str(e.value) and "\n" not in str(e.value)
