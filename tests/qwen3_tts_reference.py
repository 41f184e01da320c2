"""Runs in .venv-qwen-tts (qwen-tts 0.1.1, transformers 4.57.3), never in the project's environment.

`python tests/qwen3_tts_reference.py CASES.json`: for each case, build the reference Qwen3-TTS model from
the case's config.json dict with seeded random weights, save it with `save_pretrained` (plus its
generation_config.json) into the case's directory, which must already hold the tokenizer files, and
generate greedily through the reference's own entry points (generate_custom_voice / generate_voice_design).
The speech tokenizer's decoder is not needed for codes: a recorder stands in for it and keeps the codes.
Writes `reference.pt` in each directory: codes [F, 16], the talker's codec-head logits (prefill [P, V],
then one row per step) and the code predictor's logits per frame [F, 15, V].
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor
from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
from transformers import Qwen2TokenizerFast


class Recorder:
    """Where the speech tokenizer would decode: keeps the codes it is given."""

    def __init__(self) -> None:
        self.codes: list[torch.Tensor] = []

    def decode(self, items: list[dict]) -> tuple[list[np.ndarray], int]:
        self.codes = [i["audio_codes"] for i in items]
        return [np.zeros(1, np.float32) for _ in items], 24000


def random_weights_(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


def run(case: dict) -> None:
    out = Path(case["dir"])
    cfg = Qwen3TTSConfig(**case["config"])
    model = Qwen3TTSForConditionalGeneration(cfg).eval()
    random_weights_(model, case["seed"])
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps(case["generation"]))
    recorder = Recorder()
    model.load_speech_tokenizer(recorder)
    model.load_generate_config(case["generation"])
    talker_logits: list[torch.Tensor] = []
    predictor_logits: list[torch.Tensor] = []
    model.talker.codec_head.register_forward_hook(lambda m, i, o: talker_logits.append(o[0].detach().clone()))
    for head in model.talker.code_predictor.lm_head:
        head.register_forward_hook(lambda m, i, o: predictor_logits.append(o[0, -1].detach().clone()))
    tts = Qwen3TTSModel(model, Qwen3TTSProcessor(tokenizer=Qwen2TokenizerFast.from_pretrained(out)),
                        case["generation"])
    greedy = dict(do_sample=False, subtalker_dosample=False)
    if cfg.tts_model_type == "custom_voice":
        tts.generate_custom_voice(text=case["text"], speaker=case["speaker"], language=case["language"],
                                  instruct=case["instruct"], **greedy)
    elif cfg.tts_model_type == "voice_design":
        tts.generate_voice_design(text=case["text"], instruct=case["instruct"], language=case["language"], **greedy)
    else:
        raise ValueError(f"no reference run for {cfg.tts_model_type}")
    codes = recorder.codes[0]
    groups = cfg.talker_config.num_code_groups - 1
    steps = len(predictor_logits) // groups
    torch.save({"codes": codes, "talker_prefill": talker_logits[0], "talker_steps": torch.cat(talker_logits[1:]),
                "predictor": torch.stack(predictor_logits).view(steps, groups, -1)}, out / "reference.pt")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    for c in json.loads(Path(sys.argv[1]).read_text()):
        run(c)
