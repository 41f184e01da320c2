"""Run by tests/test_qwen3_tts_codec.py under .venv-qwen-tts's python (qwen-tts 0.1.1, transformers 4.57.3).

Builds a tiny random 12 Hz speech tokenizer with the reference package's own classes, saves it with
save_pretrained into OUT/speech_tokenizer, and writes the reference's decode of random codes and encode of
a random waveform to OUT/reference.safetensors.
usage: python qwen_tts_codec.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
from safetensors.torch import save_file

FRAMES = 40
WAVE = 12000  # 6.25 frames of 1920 samples: the encoder's last frame is partial
GAIN = 0.5  # weight scale: the decoded waveform stays inside [-1, 1], so the clamp hides nothing

DECODER = {
    "codebook_size": 64, "hidden_size": 32, "latent_dim": 48, "codebook_dim": 24, "head_dim": 12,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 64,
    "sliding_window": 8, "decoder_dim": 64, "num_quantizers": 16, "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2], "rope_theta": 10000, "max_position_embeddings": 8000,
}
ENCODER = {
    "hidden_size": 32, "num_filters": 4, "codebook_size": 64, "codebook_dim": 16, "num_quantizers": 16,
    "num_semantic_quantizers": 1, "vector_quantization_hidden_dimension": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8, "intermediate_size": 64,
    "sliding_window": 16, "upsample_groups": 32, "frame_rate": 12.5,
}


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Nonzero values everywhere (the reference initializes codebooks, layer scales and SnakeBeta to
    constants that would hide mistakes); codebook usages positive."""
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if not t.is_floating_point():
                continue
            if name.endswith("cluster_usage"):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            elif name.endswith(("norm.weight", "layernorm.weight")):
                t.copy_(1 + 0.1 * torch.randn(t.shape, generator=gen))
            elif t.dim() >= 2 and "codebook" not in name and "embed" not in name:  # matrices and kernels
                t.copy_(torch.randn(t.shape, generator=gen) * (GAIN / (t.numel() / t.shape[0]) ** 0.5))
            elif "inv_freq" not in name:
                t.copy_(0.2 * torch.randn(t.shape, generator=gen))


def main(out: Path) -> None:
    gen = torch.Generator().manual_seed(7)
    cfg = Qwen3TTSTokenizerV2Config(encoder_config=ENCODER, decoder_config=DECODER, encoder_valid_num_quantizers=16)
    model = Qwen3TTSTokenizerV2Model(cfg).eval()
    randomize(model, gen)
    model.save_pretrained(out / "speech_tokenizer")
    codes = torch.randint(0, DECODER["codebook_size"], (1, FRAMES, DECODER["num_quantizers"]), generator=gen)
    t = torch.arange(WAVE) / 24000.0
    wave = (0.3 * torch.sin(2 * torch.pi * 220 * t) + 0.05 * torch.randn(WAVE, generator=gen)).float()
    with torch.no_grad():
        decoded = model.decode(codes, return_dict=True).audio_values[0]
        encoded = model.encode(wave[None], torch.ones(1, WAVE, dtype=torch.long), return_dict=True).audio_codes[0]
    save_file({"codes": codes[0].contiguous(), "wave": decoded.contiguous(), "audio": wave,
               "audio_codes": encoded.contiguous()}, str(out / "reference.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
