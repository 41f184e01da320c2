"""The thinker's fixed-shape steps as pure functions of static tensors: what the graph runner captures.

Shapes depend only on the batch bucket and rows are independent, so padding rows change no real row's result."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.common.prefill import last_hidden, prefill_step_inputs
from pipelines.graphs import Input, Tensors
from pipelines.kv_cache import PagedKVCache
from pipelines.kv_views import DecodeKV, PrefillKV, decode_inputs
from pipelines.sampling import sampling_inputs, static_sampler

from .model import Qwen3Omni


@dataclass
class ThinkerDecode:
    """One thinker token per row, sampled among the tokenizer's first `vocab` ids (a checkpoint's lm_head may be
    wider); `no_eos` rows (benchmarks) never sample im_end; `bad`: rows whose logits hold NaN. `greedy`: the step for
    all-greedy batches, argmax without the sampler's sort and draws (the ids the full step gives greedy rows)."""

    model: Qwen3Omni
    cache: PagedKVCache
    vocab: int
    greedy: bool = False

    def inputs(self, dtype: torch.dtype, max_blocks: int, scratch_slot: int) -> dict[str, Input]:
        h = self.model.cfg.thinker.text.hidden_size
        return {"x": Input((1, h), dtype, on_device=True), **decode_inputs(max_blocks, scratch_slot),
                **sampling_inputs("s"), "step": Input((), torch.long), "no_eos": Input((), torch.bool, False)}

    def __call__(self, b: Tensors) -> Tensors:
        kv = DecodeKV(self.cache, b)
        hidden, _ = self.model.thinker(b["x"], kv.positions, kv)
        return self.token(hidden[:, -1], b)

    def token(self, hidden: torch.Tensor, b: Tensors) -> Tensors:
        """The token sampled from the thinker's last hidden states [B, H] (rows as `b`'s)."""
        thinker, talker = self.model.thinker, self.model.talker
        logits = thinker.logits(hidden)[:, : self.vocab]
        eos = torch.arange(logits.shape[-1], device=logits.device)[None, :] == self.model.cfg.im_end_token_id
        suppress = b["no_eos"][:, None] & eos
        sampler = static_sampler(b, "s")
        sampler.all_greedy = self.greedy
        ids = sampler(logits, b["step"], suppress=suppress)
        embeds = thinker.embed(ids)
        out = {"ids": ids, "embeds": embeds, "bad": logits.isnan().any(dim=-1)}
        if talker is not None:  # a thinker-only model has no talker to feed
            out["projected"] = talker.project_text(embeds)
        return out


@dataclass
class ThinkerPrefill:
    """The prefill of S sequences (rows), T (bucket) tokens each: each one's next token as `ThinkerDecode`
    samples it, and `captured`, the hidden states entering `capture_layer` (for the talker's user rows)."""

    decode: ThinkerDecode
    capture_layer: int | None

    def inputs(self, dtype: torch.dtype, tokens: int, max_blocks: int) -> dict[str, Input]:
        h = self.decode.model.cfg.thinker.text.hidden_size
        return {**prefill_step_inputs(h, dtype, tokens, max_blocks, self.decode.cache), **sampling_inputs("s"),
                "step": Input((), torch.long, 0)}

    def __call__(self, b: Tensors) -> Tensors:
        kv = PrefillKV(self.decode.cache, b)
        hidden, captured = self.decode.model.thinker(b["x"], kv.positions, kv, self.capture_layer)
        out = self.decode.token(last_hidden(hidden, b["last"]), b)
        return out if captured is None else {"captured": captured, **out}
