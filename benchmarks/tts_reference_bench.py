"""Reference baseline for Qwen3-TTS: the qwen-tts 0.1.1 package (its own environment: transformers 4.57.3),
full size 1.7B CustomVoice, seeded random weights.

It also writes the checkpoint it made (the reference's `save_pretrained`, in the published layout: config.json,
generation_config.json, model.safetensors in bf16, the tokenizer files, speech_tokenizer/) so that our server
reads exactly the same model in the same device call (`bench_speech.py --model DIR`).

qwen-tts does not stream: `generate_custom_voice` returns the whole waveform, so its time to first audio is
the whole call. Random weights never emit EOS, so every reply runs to `--frames` codec frames.

  . benchmarks/tts_reference_env/setup.sh        # on the GPU machine, then:
  PYTHONPATH=$REFPATH python3 benchmarks/tts_reference_bench.py --out DIR --tokenizer TOKDIR
  .venv-qwen-tts/bin/python benchmarks/tts_reference_bench.py --tiny --device cpu --out /tmp/t --tokenizer TOKDIR

TOKDIR holds the published repos' tokenizer files (vocab.json, merges.txt, tokenizer_config.json), e.g. written by
`tests.reference_paths.save_tokenizer(Tokenizer.builtin(), TOKDIR)` without its tokenizer.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.qwen3_tts.tiny import tiny_codec, tiny_config, tiny_generation  # noqa: E402

# The published 1.7B sizes (talker 28 x 2048, code predictor 5 x 1024); ids, speakers and languages as tiny's.
FULL_TALKER = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=128, text_hidden_size=2048)
FULL_PREDICTOR = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128)

FULL_CODEC = dict(codebook_dim=512)  # the decoder config class's defaults give the rest (8 layers, 1536 channels)


def full_config() -> dict:
    c = tiny_config("custom_voice")
    c["talker_config"].update(FULL_TALKER)
    c["talker_config"]["rope_scaling"]["mrope_section"] = [24, 20, 20]
    c["talker_config"]["code_predictor_config"].update(FULL_PREDICTOR)
    return c


def random_(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if not t.is_floating_point() or "inv_freq" in name:
                continue
            leaf = name.rsplit(".", 1)[-1]
            r = torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32)
            if leaf == "cluster_usage":
                t.copy_(r.abs() + 0.5)
            elif t.dim() >= 2:
                t.copy_(r / math.sqrt(max(1, t[0].numel())))
            elif leaf in ("alpha", "beta", "bias"):
                t.copy_(0.02 * r)
            else:
                t.copy_(1 + 0.1 * r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the checkpoint is written")
    ap.add_argument("--tokenizer", type=Path, required=True, help="a folder with vocab.json, merges.txt, ...")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--frames", type=int, default=150, help="codec frames per reply (12.5 a second)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--chars", type=int, default=200)
    args = ap.parse_args()

    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer
    from transformers import Qwen2TokenizerFast

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cfg = Qwen3TTSConfig(**(tiny_config("custom_voice") if args.tiny else full_config()))
    with torch.device(args.device):
        model = Qwen3TTSForConditionalGeneration(cfg).to(dtype).eval()
    random_(model, 0)
    generation = tiny_generation() | {"max_new_tokens": args.frames + 1}
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps(generation))
    for f in args.tokenizer.iterdir():
        shutil.copy(f, out / f.name)
    codec_cfg = Qwen3TTSTokenizerV2Config(decoder_config=tiny_codec() if args.tiny else FULL_CODEC)
    codec = Qwen3TTSTokenizerV2Model(codec_cfg).eval()
    random_(codec, 1)
    codec.save_pretrained(out / "speech_tokenizer")
    codec = codec.to(args.device)
    wrapper = Qwen3TTSTokenizer()
    wrapper.model, wrapper.config, wrapper.device = codec, codec.config, torch.device(args.device)
    model.load_speech_tokenizer(wrapper)
    model.load_generate_config(generation)
    tts = Qwen3TTSModel(model, Qwen3TTSProcessor(tokenizer=Qwen2TokenizerFast.from_pretrained(out)), generation)
    build_s = time.perf_counter() - t0

    text = ("The quick brown fox jumps over the lazy dog. " * (args.chars // 40 + 1))[:args.chars]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    times, audio = [], []
    for i in range(args.runs + 1):  # the first run warms up
        sync()
        t = time.perf_counter()
        wavs, rate = tts.generate_custom_voice(text=text, speaker="Vivian", language="English", max_new_tokens=(
            args.frames + 1) if i else 4)
        sync()
        if i:
            times.append(time.perf_counter() - t)
            audio.append(len(wavs[0]) / rate)
    print(json.dumps({
        "reference": "qwen-tts 0.1.1 generate_custom_voice (transformers " + __import__("transformers").__version__
                     + ")", "size": "tiny" if args.tiny else "1.7B", "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "dtype": str(dtype), "build_and_save_s": round(build_s, 1), "chars": args.chars, "frames": args.frames,
        "first_audio_ms_p50": round(statistics.median(times) * 1000, 1), "audio_s": round(statistics.median(audio), 2),
        "rtf": round(statistics.median(times) / statistics.median(audio), 3), "checkpoint": str(out)}))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
