"""Qwen3-Omni's fixed-shape steps as pure functions of static tensors: what the graph runner captures.

`ThinkerDecode`: one reply token per row (decoder stack over the paged cache, lm_head, sampling) and
what the later stages need of it (its embedding, its talker text row). `TalkerFrame`: one whole codec
frame per row (talker step, codec head, sampling with the repetition penalty, the 15 code-predictor
steps with their sampling, and the embedding sum that feeds the next frame). `ThinkerPrefill` and
`TalkerPrefill`: one sequence's new tokens (a token bucket), ending in the same token or frame. Inputs and outputs are
tensors whose shapes depend only on the batch bucket; rows are independent, so padding rows change
no real row's result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipelines.graphs import Input, Tensors
from pipelines.kv_cache import PagedKVCache
from pipelines.kv_views import DecodeKV, PrefillKV, decode_inputs, prefill_inputs
from pipelines.sampling import gumbel_noise
from pipelines.step_sampling import sampling_inputs, static_sampler

from .model import Qwen3Omni


@dataclass
class ThinkerDecode:
    """One thinker token per row, sampled among the tokenizer's first `vocab` ids (a checkpoint's lm_head
    may be wider); `no_eos` rows (benchmarks) never sample im_end. `bad`: rows whose logits hold NaN."""

    model: Qwen3Omni
    cache: PagedKVCache
    vocab: int

    def inputs(self, dtype: torch.dtype, max_blocks: int, scratch_slot: int) -> dict[str, Input]:
        h = self.model.cfg.thinker.text.hidden_size
        return {"x": Input((1, h), dtype), **decode_inputs(max_blocks, scratch_slot), **sampling_inputs("s"),
                "step": Input((), torch.long), "no_eos": Input((), torch.bool, False)}

    def __call__(self, b: Tensors) -> Tensors:
        kv = DecodeKV(self.cache, b)
        hidden, _ = self.model.thinker(b["x"], kv.positions, kv)
        return self.token(hidden[:, -1], b)

    def token(self, hidden: torch.Tensor, b: Tensors) -> Tensors:
        """The token sampled from the thinker's last hidden states [B, H] (rows as `b`'s)."""
        thinker, talker = self.model.thinker, self.model.talker
        logits = thinker.logits(hidden)[:, : self.vocab]
        suppress = b["no_eos"][:, None] & self._eos(logits.shape[-1], logits.device)
        ids = static_sampler(b, "s")(logits, b["step"], suppress=suppress)
        embeds = thinker.embed(ids)
        out = {"ids": ids, "embeds": embeds, "bad": logits.isnan().any(dim=-1)}
        if talker is not None:  # a thinker-only model has no talker to feed
            out["projected"] = talker.project_text(embeds)
        return out

    def _eos(self, vocab: int, device: torch.device) -> torch.Tensor:
        return torch.arange(vocab, device=device)[None, :] == self.model.cfg.im_end_token_id


@dataclass
class TalkerFrame:
    """One codec frame per row. `seen` [slots, V]: each talker stream's codebook-0 ids so far (row
    `slot` of the step), updated in place; `suppress` [V]: the codec control ids never sampled."""

    model: Qwen3Omni
    cache: PagedKVCache
    seen: torch.Tensor
    suppress: torch.Tensor
    eos: int

    def inputs(self, dtype: torch.dtype, max_blocks: int, scratch_slot: int, scratch_row: int) -> dict[str, Input]:
        h = self.model.cfg.talker.text.hidden_size
        return {"x": Input((1, h), dtype), **decode_inputs(max_blocks, scratch_slot), **sampling_inputs("t"),
                **sampling_inputs("p"), "frame": Input((), torch.long), "slot": Input((), torch.long, scratch_row),
                "no_eos": Input((), torch.bool, False)}

    def __call__(self, b: Tensors) -> Tensors:
        kv = DecodeKV(self.cache, b)
        return self.frame(self.model.talker(b["x"], kv.positions, kv)[:, -1], b)

    def frame(self, hidden: torch.Tensor, b: Tensors) -> Tensors:
        """The codec frame chosen from the talker's last hidden states [B, H] (rows as `b`'s)."""
        talker = self.model.talker
        logits = talker.codec_logits(hidden)
        eos = torch.arange(logits.shape[-1], device=logits.device)[None, :] == self.eos
        suppress = self.suppress[None, :] | (b["no_eos"][:, None] & eos)
        code0 = static_sampler(b, "t")(logits, b["frame"], self.seen[b["slot"]], suppress)
        predictor, frame_no = static_sampler(b, "p"), b["frame"]
        cp = talker.code_predictor
        steps = frame_no[:, None] * 16 + torch.arange(cp.num_steps, device=frame_no.device)
        noise = gumbel_noise(predictor.seed, steps, cp.cfg.vocab_size)  # all 15 draws' noise at once
        frame = talker.next_frame(hidden, code0, lambda lg, i: predictor(lg, steps[:, i], gumbel=noise[:, i]))
        self.seen[b["slot"], code0] = torch.ones_like(code0, dtype=torch.bool)  # a device value: capturable
        return {"codes": frame.codes, "embed_sum": frame.embed_sum, "bad": logits.isnan().any(dim=-1)}


def _prefill_inputs(h: int, dtype: torch.dtype, tokens: int, max_blocks: int, cache: PagedKVCache) -> dict[str, Input]:
    """Per sequence (row): its new tokens and what it samples from its last one."""
    return {"x": Input((tokens, h), dtype), **prefill_inputs(tokens, max_blocks, cache),
            "last": Input((), torch.long, 0), "no_eos": Input((), torch.bool, False)}


def _last(hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """[S, T, H] -> [S, H]: each row's hidden state at its last real token."""
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


@dataclass
class ThinkerPrefill:
    """The prefill of S sequences (rows), T (bucket) tokens each: each one's next token as
    `ThinkerDecode` samples it, and `captured`, the hidden states entering `capture_layer` (the talker's
    user rows; none without a capture layer)."""

    decode: ThinkerDecode
    capture_layer: int | None

    def inputs(self, dtype: torch.dtype, tokens: int, max_blocks: int) -> dict[str, Input]:
        h = self.decode.model.cfg.thinker.text.hidden_size
        return {**_prefill_inputs(h, dtype, tokens, max_blocks, self.decode.cache), **sampling_inputs("s"),
                "step": Input((), torch.long, 0)}

    def __call__(self, b: Tensors) -> Tensors:
        kv = PrefillKV(self.decode.cache, b)
        hidden, captured = self.decode.model.thinker(b["x"], kv.positions, kv, self.capture_layer)
        out = self.decode.token(_last(hidden, b["last"]), b)
        return out if captured is None else {"captured": captured, **out}


@dataclass
class TalkerPrefill:
    """The prefill of S talker streams (rows), T (bucket) tokens each, and each one's next frame."""

    frame: TalkerFrame

    def inputs(self, dtype: torch.dtype, tokens: int, max_blocks: int, scratch_row: int) -> dict[str, Input]:
        h = self.frame.model.cfg.talker.text.hidden_size
        return {**_prefill_inputs(h, dtype, tokens, max_blocks, self.frame.cache), **sampling_inputs("t"),
                **sampling_inputs("p"), "frame": Input((), torch.long, 0), "slot": Input((), torch.long, scratch_row)}

    def __call__(self, b: Tensors) -> Tensors:
        kv = PrefillKV(self.frame.cache, b)
        return self.frame.frame(_last(self.frame.model.talker(b["x"], kv.positions, kv), b["last"]), b)
