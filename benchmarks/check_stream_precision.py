"""Streamed vs one-shot Code2Wav at full size on the device, per dtype (random weights).

  python benchmarks/check_stream_precision.py [--device cuda] [--frames 24]

Prints one JSON line: relative L2 difference of the streamed waveform (one frame per push) against
the one-shot decode of the same codes, before the clamp, plus the pre-clamp peak.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.common.code2wav import Code2Wav  # noqa: E402
from models.common.code2wav_batch import Code2WavSlots  # noqa: E402
from models.common.weights import random_weights_  # noqa: E402
from models.qwen3_omni.config import OmniConfig  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--frames", type=int, default=24)
    args = ap.parse_args()
    cfg = OmniConfig.from_hf(json.loads(FULL_CONFIG.read_text())).code2wav
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, args.frames), device=args.device)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = Code2Wav(cfg).to(args.device)
        random_weights_(model, 0)
        model = model.to(dtype).eval()
        with torch.inference_mode():
            whole = model.decode(codes, clamp=False).float().reshape(-1)
            dec = Code2WavSlots(model, 1, args.device, dtype, clamp=False)
            slot = dec.open()
            parts = [dec.push(slot, codes[..., i]) for i in range(args.frames)]
            streamed = torch.cat([p.reshape(-1) for p in parts]).float()
        out[str(dtype).removeprefix("torch.")] = {
            "stream_vs_oneshot_rel": float((streamed - whole).norm() / whole.norm()),
            "peak": float(whole.abs().max()),
        }
    print(json.dumps({"device": args.device, "frames": args.frames, **out}))


if __name__ == "__main__":
    main()
