"""The frame LM's fixed-shape steps, pure functions of static tensors (what the graph runner captures): `FrameStep`
makes one codec frame per row, `FramePrefill` feeds streams' new tokens and ends in the same frame. Rows are
independent, so padding rows change no real row's result."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipelines.graphs import Input, Tensors
from pipelines.kv_cache import PagedKVCache
from pipelines.kv_views import DecodeKV, PrefillKV, decode_inputs
from pipelines.sampling import sampling_inputs, static_sampler

from .frame import FrameTalker
from .prefill import last_hidden, prefill_step_inputs


@dataclass
class FrameStep:
    """One codec frame per row. `seen` [slots, V]: each talker stream's codebook-0 ids so far (row `slot`
    of the step), updated in place; `suppress` [V]: the codec control ids never sampled; `eos`: the id
    that ends the speech (sampled unless the row's `no_eos`, and never before frame `min_frames`)."""

    talker: FrameTalker
    cache: PagedKVCache
    seen: torch.Tensor
    suppress: torch.Tensor
    eos: int
    min_frames: int = 0

    def inputs(self, dtype: torch.dtype, max_blocks: int, scratch_slot: int, scratch_row: int) -> dict[str, Input]:
        x = Input((1, self.talker.hidden_size), dtype, on_device=True)
        return {"x": x, **decode_inputs(max_blocks, scratch_slot), **self.sampling_inputs(scratch_row),
                "no_eos": Input((), torch.bool, False)}

    def sampling_inputs(self, scratch_row: int) -> dict[str, Input]:
        return {**sampling_inputs("t"), **sampling_inputs("p"), "frame": Input((), torch.long, 0),
                "slot": Input((), torch.long, scratch_row)}

    def __call__(self, b: Tensors) -> Tensors:
        kv = DecodeKV(self.cache, b)
        return self.frame(self.talker(b["x"], kv.positions, kv)[:, -1], b)

    def frame(self, hidden: torch.Tensor, b: Tensors) -> Tensors:
        """The codec frame chosen from the talker's last hidden states [B, H] (rows as `b`'s)."""
        logits = self.talker.codec_logits(hidden)
        eos = torch.arange(logits.shape[-1], device=logits.device)[None, :] == self.eos
        no_eos = b["no_eos"] | (b["frame"] < self.min_frames)
        suppress = self.suppress[None, :] | (no_eos[:, None] & eos)
        code0 = static_sampler(b, "t")(logits, b["frame"], self.seen[b["slot"]], suppress)
        predictor, frame_no = static_sampler(b, "p"), b["frame"]
        cp = self.talker.code_predictor
        steps = frame_no[:, None] * (cp.num_steps + 1) + torch.arange(cp.num_steps, device=frame_no.device)
        frame = self.talker.next_frame(hidden, code0, lambda lg, i: predictor(lg, steps[:, i]))
        self.seen[b["slot"], code0] = torch.ones_like(code0, dtype=torch.bool)  # a device value: capturable
        return {"codes": frame.codes, "embed_sum": frame.embed_sum, "bad": logits.isnan().any(dim=-1)}


@dataclass
class FramePrefill:
    """The prefill of S talker streams (rows), T tokens each, and each one's next frame."""

    step: FrameStep

    def inputs(self, dtype: torch.dtype, tokens: int, max_blocks: int, scratch_row: int) -> dict[str, Input]:
        step = self.step
        return {**prefill_step_inputs(step.talker.hidden_size, dtype, tokens, max_blocks, step.cache),
                **step.sampling_inputs(scratch_row)}

    def __call__(self, b: Tensors) -> Tensors:
        kv = PrefillKV(self.step.cache, b)
        return self.step.frame(last_hidden(self.step.talker(b["x"], kv.positions, kv), b["last"]), b)
