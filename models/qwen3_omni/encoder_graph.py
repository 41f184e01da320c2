"""The audio encoder's transformer at fixed shapes, for the commit's tails: CUDA graphs per window count. Eager,
one call is some 400 small kernels (32 layers), each launched from an engine thread that shares the GIL with the
sockets' thread: 70-240 ms an encoder step at 64-128 sessions on the H200 (benchmarks/RESULTS.md). The tokens are
laid out in their window grid (`AudioEncoder.transform_grid`), one row per window; padding windows are all zeros
and attend to themselves."""

from __future__ import annotations

import torch

from pipelines.graphs import BUCKETS, GraphRunner, Input

from .audio_encoder import AudioEncoder


class EncoderGraph:
    def __init__(self, tower: AudioEncoder, dtype: torch.dtype, device: torch.device, graphs: bool) -> None:
        cfg = tower.cfg
        self.tower = tower
        self.chunk_tokens = tower.chunk_tokens
        w = tower.window_tokens(self.chunk_tokens)
        inputs = {"x": Input((w, cfg.d_model), dtype, on_device=True),
                  "mask": Input((w,), torch.bool, True, on_device=True)}
        self.runner = GraphRunner("audio_encoder", lambda b: {"out": tower.transform_grid(b["x"], b["mask"])},
                                  inputs, device, BUCKETS, graphs)

    def capture(self, pool: object | None) -> object | None:
        return self.runner.capture(pool)

    def __call__(self, x: torch.Tensor, frames: list[int]) -> torch.Tensor:
        """`AudioEncoder.transform(x, frames, chunk_tokens)`; more windows than the largest bucket run eagerly."""
        slots, mask = self.tower.windows(frames, self.chunk_tokens, x.device)
        nw, w = mask.shape
        if nw > self.runner.buckets[-1]:
            return self.tower.transform(x, frames, self.chunk_tokens)
        grid = x.new_zeros(nw * w, x.shape[1])
        grid[slots] = x
        return self.runner(nw, {"x": grid.view(nw, w, -1), "mask": mask})["out"].flatten(0, 1)[slots]
