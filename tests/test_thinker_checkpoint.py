"""A Qwen3-Omni checkpoint without a talker (the Thinking and Captioner layout), saved by transformers and
loaded through the registry from its directory, serves text turns equal to transformers' greedy generate;
a checkpoint with a quantization_config we do not read is refused in one short line naming its method."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models import registry
from models.qwen3_omni import chat
from models.qwen3_omni.tiny import random_weights_, tiny_config
from models.qwen3_omni.tokenizer import Tokenizer
from pipelines.types import GenerationOptions, Message, TextDelta, Turn, TurnDone, TurnError

TOKENS = 8
SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def thinker_only(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """transformers' tiny Qwen3-Omni built without audio output, saved, and its config.json stripped of the
    talker_config and code2wav_config sections, as the Thinking and Captioner checkpoints ship."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    path = tmp_path_factory.mktemp("thinker_only")
    torch.manual_seed(0)
    cfg = Qwen3OmniMoeConfig(**{**tiny_config("a"), "enable_audio_output": False})
    model = Qwen3OmniMoeForConditionalGeneration(cfg)
    model = model.float().eval()
    random_weights_(model, 0)
    model.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    for key in ("talker_config", "code2wav_config"):
        config.pop(key)
    (path / "config.json").write_text(json.dumps(config))
    assert not any(k.startswith(("talker.", "code2wav.")) for k in model.state_dict())
    return path, model


def test_thinker_only_checkpoint_serves_text_equal_to_generate(thinker_only):
    path, hf = thinker_only
    text = "Name three colours."
    ids = list(chat.render(Tokenizer.builtin(), [chat.Turn("system", SYSTEM), chat.Turn("user", text)]).ids)
    with torch.no_grad():
        ref = hf.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          return_audio=False, thinker_max_new_tokens=TOKENS, thinker_do_sample=False)
    sequences = ref.sequences if hasattr(ref, "sequences") else ref
    expected = sequences[0, len(ids):].tolist()
    assert registry.model_type(str(path)) == "qwen3_omni_moe"
    with registry.build_pipeline(str(path)) as p:
        spec = p.spec
        assert not spec.speaks and spec.text_out and spec.voices == ()
        turn = Turn("s", [Message("system", SYSTEM), Message("user", text)],
                    GenerationOptions(audio=False, greedy=True, max_text_tokens=TOKENS))
        events = p.run(turn, timeout_s=120)
        refused = p.run(Turn("t", [Message("user", text)], GenerationOptions(greedy=True, max_text_tokens=2)), 60)
        p.end_session("s")
        p.end_session("t")
        assert not any(p.kv_check().values())
    done = events[-1]
    assert isinstance(done, TurnDone), done
    assert list(done.text_ids) == expected and done.usage.input_tokens == len(ids)
    assert all(isinstance(e, TextDelta) for e in events[:-1]) and done.codes == ()
    assert len(refused) == 1 and isinstance(refused[0], TurnError) and refused[0].code == "invalid_request"


@pytest.mark.parametrize("talker", [True, False], ids=["omni", "thinker-only"])
def test_a_quantized_checkpoint_is_refused_in_one_line(tmp_path, talker):
    from transformers import Qwen3OmniMoeConfig

    config = Qwen3OmniMoeConfig(**tiny_config("a")).to_dict()  # as save_pretrained writes it
    if not talker:
        for key in ("talker_config", "code2wav_config"):
            config.pop(key)
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(config))  # no weights: refused before reading any
    with pytest.raises(ValueError) as refused:
        registry.build_pipeline(str(tmp_path))
    message = str(refused.value)
    assert "fp8" in message and "\n" not in message and len(message) < 200, message
