"""Runs in .venv-qwen-tts (qwen-tts 0.1.1, transformers 4.57.3), never in the project's environment.

`python tests/qwen3_tts_reference.py CASES.json`: for each case, build the reference Qwen3-TTS model from
the case's config.json dict with seeded random weights, save it with `save_pretrained` (plus its
generation_config.json) into the case's directory, which must already hold the tokenizer files, and
generate greedily through the reference's own entry points (generate_custom_voice / generate_voice_design /
generate_voice_clone, the last from the x-vector alone or, given the case's `ref_text`, in context).
A tiny random 12 Hz speech tokenizer, made with the reference's classes from the case's `codec` decoder
config, is saved into `speech_tokenizer/`, encodes the reference audio and decodes the codes (the
reference's wrapper, recording them). Writes `reference.pt` in each directory: codes [F, 16], the waveform
the entry point returns, the talker's input embeddings over the prompt [P, H], its codec-head logits
(prefill [P, V], then one row per step) and the code predictor's logits per frame [F, 15, V].
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel, VoiceClonePromptItem
from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer
from transformers import EncodecFeatureExtractor, Qwen2TokenizerFast

ENCODER = {  # a tiny Mimi encoder (in-context cloning encodes the reference audio with it)
    "hidden_size": 32, "num_filters": 4, "codebook_size": 2048, "codebook_dim": 16, "num_quantizers": 16,
    "num_semantic_quantizers": 1, "vector_quantization_hidden_dimension": 16, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8, "intermediate_size": 64,
    "sliding_window": 16, "upsample_groups": 32, "frame_rate": 12.5,
}


class RecordingTokenizer(Qwen3TTSTokenizer):
    """The reference's speech tokenizer wrapper, keeping the codes it decodes and the waveforms."""

    def __init__(self, model: Qwen3TTSTokenizerV2Model) -> None:
        super().__init__()
        self.model, self.config, self.device = model, model.config, torch.device("cpu")
        self.feature_extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000)
        self.codes: list[torch.Tensor] = []
        self.wavs: list[np.ndarray] = []

    def decode(self, encoded):
        self.codes = [e["audio_codes"] for e in encoded]
        self.wavs, rate = super().decode(encoded)
        return self.wavs, rate


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


def speech_tokenizer(case: dict, out: Path) -> RecordingTokenizer:
    cfg = Qwen3TTSTokenizerV2Config(encoder_config=ENCODER, decoder_config=case["codec"],
                                    encoder_valid_num_quantizers=16)
    model = Qwen3TTSTokenizerV2Model(cfg).eval()
    g = torch.Generator().manual_seed(case["seed"] + 1000)
    for name, t in [*model.named_parameters(), *model.named_buffers()]:  # nothing left at a constant
        if not t.is_floating_point() or "inv_freq" in name:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "cluster_usage":
            t.copy_(torch.rand(t.shape, generator=g) + 0.5)
        elif t.dim() >= 2:  # a healthy scale, so that the random decoder's output is not all clipped
            t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(t[0].numel()))
        elif leaf in ("alpha", "beta", "bias"):
            t.copy_(0.1 * torch.randn(t.shape, generator=g))
        else:
            t.copy_(1 + 0.1 * torch.randn(t.shape, generator=g))
    model.save_pretrained(out / "speech_tokenizer")
    return RecordingTokenizer(model)


_TEXT_TOKENIZERS: dict[bytes, Qwen2TokenizerFast] = {}


def text_tokenizer(d: Path) -> Qwen2TokenizerFast:
    """`Qwen2TokenizerFast.from_pretrained(d)`, loaded once for each distinct set of files (the cases share one;
    each load builds the fast tokenizer from vocab.json and merges.txt, about half a second)."""
    files = b"".join((d / n).read_bytes() for n in ("vocab.json", "merges.txt", "tokenizer_config.json"))
    key = hashlib.sha256(files).digest()
    if key not in _TEXT_TOKENIZERS:
        _TEXT_TOKENIZERS[key] = Qwen2TokenizerFast.from_pretrained(d)
    return _TEXT_TOKENIZERS[key]


def run(case: dict) -> None:
    out = Path(case["dir"])
    cfg = Qwen3TTSConfig(**case["config"])
    model = Qwen3TTSForConditionalGeneration(cfg).eval()
    random_weights_(model, case["seed"])
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps(case["generation"]))
    recorder = speech_tokenizer(case, out)
    model.load_speech_tokenizer(recorder)
    model.load_generate_config(case["generation"])
    talker_logits: list[torch.Tensor] = []
    predictor_logits: list[torch.Tensor] = []
    embeds: list[torch.Tensor] = []
    model.talker.model.register_forward_pre_hook(lambda m, a, kw: embeds.append(kw["inputs_embeds"][0].clone()),
                                                 with_kwargs=True)
    model.talker.codec_head.register_forward_hook(lambda m, i, o: talker_logits.append(o[0].detach().clone()))
    for head in model.talker.code_predictor.lm_head:
        head.register_forward_hook(lambda m, i, o: predictor_logits.append(o[0, -1].detach().clone()))
    tts = Qwen3TTSModel(model, Qwen3TTSProcessor(tokenizer=text_tokenizer(out)), case["generation"])
    greedy = dict(do_sample=False, subtalker_dosample=False)
    extra: dict[str, torch.Tensor] = {}
    if cfg.tts_model_type == "custom_voice":
        wavs, _ = tts.generate_custom_voice(text=case["text"], speaker=case["speaker"], language=case["language"],
                                            instruct=case["instruct"], **greedy)
    elif cfg.tts_model_type == "voice_design":
        wavs, _ = tts.generate_voice_design(text=case["text"], instruct=case["instruct"], language=case["language"],
                                            **greedy)
    else:  # Base: the reference's own speaker embedding (and, in context, codes) of the reference audio
        g = torch.Generator().manual_seed(case["seed"])
        n = int(case.get("ref_seconds", 1) * 24000)
        t = torch.arange(n) / 24000.0
        ref_wave = (0.3 * torch.sin(2 * torch.pi * 180 * t) + 0.05 * torch.randn(n, generator=g)).float()
        extra["ref_wave"] = ref_wave
        if case.get("ref_text"):
            [item] = tts.create_voice_clone_prompt(ref_audio=(ref_wave.numpy(), 24000), ref_text=case["ref_text"])
            extra["ref_code"] = item.ref_code
        else:
            item = VoiceClonePromptItem(ref_code=None, x_vector_only_mode=True, icl_mode=False, ref_text=None,
                                        ref_spk_embedding=model.extract_speaker_embedding(ref_wave.numpy(), 24000))
        extra["xvector"] = item.ref_spk_embedding
        wavs, _ = tts.generate_voice_clone(text=case["text"], language=case["language"], voice_clone_prompt=[item],
                                           **greedy)
    codes = recorder.codes[0][len(extra.get("ref_code", ())):]  # in context it decodes the reference's codes first
    groups = cfg.talker_config.num_code_groups - 1
    steps = len(predictor_logits) // groups
    torch.save({"codes": codes, "wave": torch.from_numpy(wavs[0]), "prompt": embeds[0],
                "talker_prefill": talker_logits[0], "talker_steps": torch.cat(talker_logits[1:]),
                "predictor": torch.stack(predictor_logits).view(steps, groups, -1), **extra}, out / "reference.pt")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    for c in json.loads(Path(sys.argv[1]).read_text()):
        run(c)
