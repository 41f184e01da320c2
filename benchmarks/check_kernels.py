"""GPU check: the decode-sized forwards with every Triton path on (as served) against the same model with them
off (fused.use_triton(False), and fp8_moe's reference grouped matmul), full size, random weights, fp8 experts.

For the thinker's and the talker's text stacks (rows x tokens: decode-like, each row its own sequence) and the code
predictor's 15 steps through FrameKVCache (given the off path's talker state and teacher-forced with its greedy
codes, so each part sees the same inputs on both paths): bench_fp8_accuracy.py's comparison of the logits (relative
error, top-1 agreement, also where the top two differ by more than 0.1) and non-finite values on each path.
`--each` also runs all on but one kernel, for each: a bisection. One JSON line.

  python3 benchmarks/check_kernels.py --out $OUT/kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_fp8_accuracy import compare as accuracy  # noqa: E402
from benchmarks.bench_pipeline import print_line  # noqa: E402
from models.common import fp8_moe, fused  # noqa: E402
from models.common.code_predictor import greedy  # noqa: E402
from models.qwen3_omni.config import OmniConfig  # noqa: E402
from models.qwen3_omni.model import random_model  # noqa: E402
from models.qwen3_omni.tiny import FULL_CONFIG, tiny_config  # noqa: E402
from pipelines import fastest  # noqa: E402

GROUPED_MM = fp8_moe.grouped_mm


def kernels(on: bool, but: str | None = None) -> None:
    """All on, or all off; `but`: all on except that one of fused.SWITCHES."""
    fused.use_triton(on)
    if but:
        fused.use_triton(False, {but})
    fp8_moe.grouped_mm = GROUPED_MM if on else fp8_moe.grouped_mm_reference


def forwards(model, ids: torch.Tensor, codes: torch.Tensor, ref: dict | None = None) -> dict[str, torch.Tensor]:
    """Logits of each part; with `ref` (the other path's results) the code predictor gets ref's talker state and
    is teacher-forced with ref's codes, so every part sees the same inputs on both paths."""
    b, t = ids.shape
    pos = torch.arange(t, device=ids.device)[None].expand(b, t)
    h, _ = model.thinker(model.thinker.embed(ids), pos)
    talker = model.talker
    th = talker(talker.embed_codec(codes), pos, None)
    hidden = th[:, -1] if ref is None else ref["talker_hidden"]
    forced = None if ref is None else ref["predictor_codes"]
    pred = talker.code_predictor.predict(hidden, talker.embed_codec(codes[:, -1]),
                                         greedy if forced is None else lambda lg, i: forced[:, i])
    return {"thinker": model.thinker.logits(h).float(), "talker": talker.codec_logits(th).float(),
            "talker_hidden": hidden, "predictor": pred.logits.float(), "predictor_codes": pred.codes}


def compare(ref: torch.Tensor, got: torch.Tensor) -> dict:
    """bench_fp8_accuracy's comparison over the positions finite on both paths, and the non-finite counts."""
    fin = torch.isfinite(ref).all(-1) & torch.isfinite(got).all(-1)
    counts = {"nonfinite_ref": int((~torch.isfinite(ref)).sum()), "nonfinite_got": int((~torch.isfinite(got)).sum())}
    return (accuracy(ref[fin], got[fin]) if fin.any() else {}) | counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x1,64x1,2x16", help="rows x tokens")
    ap.add_argument("--tiny", action="store_true", help="the tiny config on CPU (the script's own smoke test)")
    ap.add_argument("--each", action="store_true",
                    help="also all on but one, for each of fused.SWITCHES (which kernel makes a difference)")
    ap.add_argument("--out")
    args = ap.parse_args()
    cfg = OmniConfig.from_hf(tiny_config("a") if args.tiny else json.loads(FULL_CONFIG.read_text()))
    dev, dtype = ("cpu", torch.float32) if args.tiny else ("cuda", torch.bfloat16)
    torch.manual_seed(0)
    model = random_model(cfg, dev, dtype, quantization="fp8")
    res: dict = {"device": "cpu" if args.tiny else torch.cuda.get_device_name(), "torch": torch.__version__}
    g = torch.Generator(device="cpu").manual_seed(1)
    with torch.inference_mode():
        for shape in args.shapes.split(","):
            b, t = (int(x) for x in shape.split("x"))
            ids = torch.randint(0, cfg.thinker.text.vocab_size, (b, t), generator=g).to(dev)
            codes = torch.randint(0, cfg.talker.code_predictor.vocab_size, (b, t), generator=g).to(dev)
            kernels(False)
            ref = forwards(model, ids, codes)
            for but in [None, *(args.each and fused.SWITCHES)]:
                kernels(True, but)
                with fastest.warming_up():  # skinny.py's picks, timed as a graph runner's warm-up times them
                    got = forwards(model, ids, codes, ref)
                row = {k: compare(ref[k], got[k]) for k in ("thinker", "talker", "predictor")}
                res[shape if but is None else f"{shape} without {but}"] = row
                print(shape, but or "all on", row, file=sys.stderr, flush=True)
            kernels(True)
    print_line(res, args.out)


if __name__ == "__main__":
    main()
