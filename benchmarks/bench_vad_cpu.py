"""CPU cost of the turn detectors, per second of a session's audio, one thread (process CPU time).

- webrtcvad (the previous server_vad), 30 ms frames;
- Silero VAD on onnxruntime, one stream (what realtime/vad.py runs) and 64 streams (64 sessions, one after another
  per frame); its TorchScript model for comparison; the ONNX model batched over 64 streams (one call a frame);
- Smart Turn v3.2: one call (features + model) on 8 s of audio.

  python benchmarks/bench_vad_cpu.py
"""

from __future__ import annotations

import json
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from realtime.silero import FRAME, SileroStream, _session  # noqa: E402
from realtime.smart_turn import SmartTurn  # noqa: E402

SECONDS = 10


def cpu_ms(fn) -> float:
    t = time.process_time()
    fn()
    return (time.process_time() - t) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    x = (np.random.default_rng(0).standard_normal(16000 * SECONDS) * 0.05).astype(np.float32)
    frames = [x[i : i + FRAME] for i in range(0, len(x) - FRAME + 1, FRAME)]
    out: dict[str, float] = {}
    pcm = (x * 32767).astype(np.int16).tobytes()
    try:  # no longer a dependency: measured where it is still installed
        import webrtcvad

        vad = webrtcvad.Vad(2)
        out["webrtcvad_ms_per_session_s"] = cpu_ms(
            lambda: [vad.is_speech(pcm[i : i + 960], 16000) for i in range(0, len(pcm) - 959, 960)]) / SECONDS
    except ImportError:
        pass
    stream = SileroStream()
    out["silero_onnx_ms_per_session_s"] = cpu_ms(lambda: [stream.frame(f) for f in frames]) / SECONDS
    streams = [SileroStream() for _ in range(64)]
    out["silero_onnx_64_sessions_cpu_s_per_s"] = cpu_ms(
        lambda: [s.frame(f) for f in frames for s in streams]) / SECONDS / 1e3
    model, sr = _session(), np.array(16000, np.int64)
    state, ctx = np.zeros((2, 64, 128), np.float32), np.zeros((64, 64), np.float32)

    def batched() -> None:
        nonlocal state, ctx
        for f in frames:
            inp = np.concatenate([ctx, np.tile(f, (64, 1))], axis=1)
            _, state = model.run(None, {"input": inp, "state": state, "sr": sr})
            ctx = inp[:, -64:]

    out["silero_onnx_batched_64_cpu_s_per_s"] = cpu_ms(batched) / SECONDS / 1e3
    jit = torch.jit.load(str(resources.files("silero_vad.data").joinpath("silero_vad.jit"))).eval()
    with torch.no_grad():
        out["silero_jit_ms_per_session_s"] = cpu_ms(lambda: [jit(torch.from_numpy(f), 16000) for f in frames]) / SECONDS
    turn = SmartTurn()
    turn.complete(x[:128000])
    out["smart_turn_ms_per_call"] = min(cpu_ms(lambda: turn.complete(x[:128000])) for _ in range(5))
    print(json.dumps({k: round(v, 3) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
