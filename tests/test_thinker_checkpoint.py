"""A Qwen3-Omni checkpoint without a talker (the Thinking and Captioner layout), saved by transformers and
loaded through the registry from its directory, serves text turns equal to transformers' greedy generate;
a checkpoint with a quantization_config we do not read is refused in one short line naming its method."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models import registry
from models.common import chat
from models.common.tokenizer import Tokenizer
from models.common.weights import random_weights_
from models.qwen3_omni.audio_features import audio_token_count, log_mel
from models.qwen3_omni.tiny import tiny_config
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


def generate(hf, ids: list[int], audios: list[torch.Tensor]) -> list[int]:
    """transformers' greedy text-only generate on our prompt ids, with each audio's own log-mel features."""
    kw = {}
    if audios:
        singles = [log_mel([a])[0][0] for a in audios]  # as the pipeline computes them: one audio at a time
        width = max(f.shape[1] for f in singles)
        kw["input_features"] = torch.stack([torch.nn.functional.pad(f, (0, width - f.shape[1])) for f in singles])
        kw["feature_attention_mask"] = torch.stack([(torch.arange(width) < f.shape[1]).long() for f in singles])
    with torch.no_grad():
        out = hf.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          return_audio=False, thinker_max_new_tokens=TOKENS, thinker_do_sample=False, **kw)
    sequences = out.sequences if hasattr(out, "sequences") else out
    return sequences[0, len(ids):].tolist()


def test_thinker_only_checkpoint_serves_text_equal_to_generate(thinker_only):
    """Greedy text of a first turn (text and audio) and of a second one on its cached KV == generate."""
    path, hf = thinker_only
    text = "Name three colours."
    assert registry.model_type(str(path)) == "qwen3_omni_moe"
    opts = GenerationOptions(audio=False, greedy=True, max_text_tokens=TOKENS)
    with registry.build_pipeline(str(path)) as p:
        spec = p.spec
        assert not spec.speaks and spec.text_out and spec.voices == () and spec.hears
        audio = torch.randn(int(1.2 * spec.input_rate), generator=torch.Generator().manual_seed(1)) * 0.1
        n_audio = int(audio_token_count(int(log_mel([audio])[1].sum())))
        prompt = [chat.Turn("system", SYSTEM), chat.Turn("user", text, n_audio)]
        ids = list(chat.render(Tokenizer.builtin(), prompt).ids)
        first = p.run(Turn("s", [Message("system", SYSTEM), Message("user", text, audio)], opts), timeout_s=120)
        second = p.run(Turn("s", [Message("user", "And two more?")], opts), timeout_s=120)
        p.sync()
        conversation = list(p.program.sessions["s"].ids)
        refused = p.run(Turn("t", [Message("user", text)], GenerationOptions(greedy=True, max_text_tokens=2)), 60)
        p.end_session("s")
        p.end_session("t")
        assert not any(p.kv_check().values())
    done = first[-1]
    assert isinstance(done, TurnDone), done
    assert list(done.text_ids) == generate(hf, ids, [audio]) and done.usage.input_tokens == len(ids)
    assert all(isinstance(e, TextDelta) for e in first[:-1]) and done.codes == ()
    again = second[-1]
    assert isinstance(again, TurnDone) and again.usage.cached_tokens > len(ids)
    assert list(again.text_ids) == generate(hf, conversation[: again.usage.input_tokens], [audio])
    assert len(refused) == 1 and isinstance(refused[0], TurnError) and refused[0].code == "invalid_request"


@pytest.mark.parametrize("talker", [True, False], ids=["omni", "thinker-only"])
def test_a_quantized_checkpoint_is_refused_in_one_line(tmp_path, talker):
    from transformers import Qwen3OmniMoeConfig

    config = Qwen3OmniMoeConfig(**tiny_config("a")).to_dict()  # as save_pretrained writes it
    if not talker:
        for key in ("talker_config", "code2wav_config"):
            config.pop(key)
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}  # fp8 loads: tests/test_fp8_loading.py
    (tmp_path / "config.json").write_text(json.dumps(config))  # no weights: refused before reading any
    with pytest.raises(ValueError) as refused:
        registry.build_pipeline(str(tmp_path))
    message = str(refused.value)
    assert "gptq" in message and "\n" not in message and len(message) < 200, message
