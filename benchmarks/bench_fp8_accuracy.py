"""fp8 experts against bf16 at full size (random weights): logits of the thinker and the talker, teacher-forced.

The thinker reads the first --tokens tokens of a real text (this repo's README and DESIGN notes, through the
real Qwen tokenizer) in one causal forward, so position t's logits are those of decode step t given the text
before it; the talker reads as many random codec ids the same way (its codebook-0 logits are what picks each
frame's first code). Then `--quantization fp8`'s `fp8_experts_` quantizes every MoE expert in place and the same
forwards run again (the experts through the fp8 kernel, models/common/fp8_moe.py). Reported per model: relative
error of the logits (Frobenius, and the median over positions), top-1 agreement over all positions and over those
whose bf16 top-1/top-2 margin exceeds 0.1, and the GPU memory the weights take in each format.

  python3 benchmarks/bench_fp8_accuracy.py --out $OUT/fp8_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_pipeline import print_line  # noqa: E402
from models.common.fp8 import fp8_experts_  # noqa: E402
from models.common.tokenizer import Tokenizer  # noqa: E402
from models.qwen3_omni.config import OmniConfig  # noqa: E402
from models.qwen3_omni.model import Qwen3Omni, random_model  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config  # noqa: E402


def real_text_ids(n: int) -> list[int]:
    text = "\n".join(p.read_text() for p in (ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md"))
    ids = Tokenizer.builtin().encode(text)
    if len(ids) < n:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than --tokens {n}")
    return ids[:n]


def logits(model: Qwen3Omni, ids: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(ids.shape[1], device=ids.device)[None]
    h, _ = model.thinker(model.thinker.embed(ids), pos)
    thinker = model.thinker.logits(h)[0].float()
    t = model.talker(model.talker.embed_codec(codes), pos[:, : codes.shape[1]], None)
    return thinker, model.talker.codec_logits(t)[0].float()


def compare(ref: torch.Tensor, got: torch.Tensor) -> dict:
    top2 = ref.topk(2, dim=-1).values
    sure = (top2[:, 0] - top2[:, 1]) > 0.1
    agree = ref.argmax(-1) == got.argmax(-1)
    per_pos = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
    return {"positions": ref.shape[0], "rel_err": round(float((got - ref).norm() / ref.norm()), 5),
            "rel_err_median": round(float(per_pos.median()), 5), "top1_agree": round(float(agree.float().mean()), 4),
            "margin_gt_0.1": int(sure.sum()), "top1_agree_margin_gt_0.1": round(float(agree[sure].float().mean()), 4)
            if sure.any() else None, "margin_median": round(float((top2[:, 0] - top2[:, 1]).median()), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--out")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = OmniConfig.from_hf(tiny_config("a") if args.tiny else json.loads(FULL_CONFIG.read_text()))
    model = random_model(cfg, args.device, dtype)
    ids = torch.tensor([real_text_ids(args.tokens)], device=args.device)
    g = torch.Generator(device="cpu").manual_seed(1)
    codebook = cfg.talker.code_predictor.vocab_size  # the codes codebook 0 draws from
    codes = torch.randint(0, codebook, (1, args.tokens), generator=g).to(args.device)
    mem = (lambda: round(torch.cuda.memory_allocated() / 2**30, 2)) if cuda else (lambda: None)
    res: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "tokens": args.tokens,
                 "weights_GiB_bf16": mem()}
    with torch.inference_mode():
        ref = logits(model, ids, codes)
        fp8_experts_(model)
        res["weights_GiB_fp8"] = mem()
        got = logits(model, ids, codes)
    res["thinker"], res["talker"] = compare(ref[0], got[0]), compare(ref[1], got[1])
    if cuda:
        res["max_memory_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    print_line(res, args.out)


if __name__ == "__main__":
    main()
