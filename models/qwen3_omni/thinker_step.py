"""The thinker stage: prefills of new turns and decode steps (forward.py), one host sync per step."""

from __future__ import annotations

from dataclasses import replace

import torch

from models.common.prefill import PrefillCall, Prefills
from models.common.work import GREEDY, NAN_MESSAGE
from pipelines import kv_views
from pipelines.graphs import GraphRunner, Tensors
from pipelines.kv_cache import PagedKVCache
from pipelines.model_runner import Finish
from pipelines.sampling import sampling_rows
from pipelines.stage import StageConfig

from .forward import ThinkerDecode, ThinkerPrefill
from .model import Qwen3Omni
from .stages import ThinkerWork
from .talker_prompt import TtsEmbeds, tts_embeds, tts_token_ids, user_mask


class ThinkerStep:
    def __init__(self, model: Qwen3Omni, dtype: torch.dtype, vocab: int, kv: PagedKVCache, sc: StageConfig) -> None:
        self.model, self.device, self.dtype, self.kv = model, torch.device(sc.device), dtype, kv
        self.vocab = vocab  # the tokenizer's size: wider lm_head rows are never sampled
        cfg = model.cfg
        self.speaks = model.talker is not None  # a thinker-only checkpoint has no talker
        self.tts: TtsEmbeds | None = None
        if self.speaks:
            ids = torch.tensor(tts_token_ids(cfg), device=self.device)
            self.tts = tts_embeds(model.talker, model.thinker.embed(ids))
        self.width = sc.graph_blocks
        step = ThinkerDecode(model, kv, vocab)
        self.graph, self.greedy_graph = (
            GraphRunner(name, s, s.inputs(dtype, self.width, kv.scratch_slot), self.device, sc.buckets, sc.graphs)
            for name, s in (("thinker", step), ("thinker_greedy", replace(step, greedy=True))))
        prefill = ThinkerPrefill(step, cfg.talker.accept_hidden_layer if self.speaks else None)
        self.prefill = Prefills("thinker_prefill", prefill, lambda t, w: prefill.inputs(dtype, t, w), kv, self.device,
                                sc.graphs)

    def capture(self, pool: object | None) -> object | None:
        return self.prefill.capture(self.greedy_graph.capture(self.graph.capture(pool)))

    def decode(self, works: list[ThinkerWork]) -> Finish | None:
        """One reply token per row through the fixed-shape step; None if a row is not a plain decode."""
        if any(not w.turn.reply_ids or self.kv.length(w.key) != len(w.turn.session.ids) - 1
               or len(self.kv.seqs[w.key].blocks) > self.width for w in works):
            return None
        x = torch.cat([w.turn.session.embeds.tail(len(w.turn.session.ids) - 1) for w in works])
        rows = kv_views.rows(self.kv, [w.key for w in works], self.width) | self._rows(works) | {"x": x}
        out = (self.greedy_graph if rows["s.greedy"].all() else self.graph)(len(works), rows)
        return lambda: self._commit(works, out)

    def run(self, works: list[ThinkerWork], lengths: list[int], prefill: bool) -> None:
        for call in self.prefill.calls(works, lengths):
            self._prefill(call)

    def _rows(self, works: list[ThinkerWork]) -> dict:
        """Each row's reply step and sampling: the inputs decode and prefill share."""
        return {"step": [len(w.turn.reply_ids) for w in works], "no_eos": [w.turn.options.ignore_eos for w in works],
                **sampling_rows("s", [w.turn.options.thinker or GREEDY for w in works])}

    def _prefill(self, call: PrefillCall) -> None:
        works = [w for w, _ in call.group]
        pasts = [self.kv.length(w.key) for w in works]
        rows = self.prefill.rows(call, lambda w: w.turn.session.embeds)
        out = call.runner(len(works), rows | self._rows(works))
        if self.speaks:  # every turn's user rows: a later turn may speak
            for i, ((w, n), past) in enumerate(zip(call.group, pasts, strict=True)):
                self._talker_user_rows(w, past, n, rows["x"][i], out["captured"][i])
        self._commit(works, out)

    def _commit(self, works: list[ThinkerWork], out: Tensors) -> None:
        ids = torch.where(out["bad"], -1, out["ids"]).tolist()  # the step's one host sync
        embeds = out["embeds"].unsqueeze(1).unbind()  # input rows [1, D]
        projected = out["projected"].unbind() if self.speaks else [None] * len(ids)
        for w, token, embed, row in zip(works, ids, embeds, projected, strict=True):
            if token < 0:
                w.fail("internal_error", f"thinker: {NAN_MESSAGE}")
                continue
            w.turn.on_token(token, embed, row)

    def _talker_user_rows(self, w: ThinkerWork, past: int, n: int, x: torch.Tensor, captured: torch.Tensor) -> None:
        """Talker rows for the user-turn positions among the ones just fed (once per position)."""
        s, cfg = w.turn.session, self.model.cfg
        lo = max(past, s.talker_done_upto)
        end = min(past + n, len(s.ids) - len(w.turn.reply_ids))  # reply tokens are never user rows
        s.talker_done_upto = max(s.talker_done_upto, end)
        if lo >= end:
            return
        ids = torch.tensor(s.ids[:end])  # on the host: the mask's test is no sync in the middle of the step
        keep = user_mask(ids, cfg)[lo:]
        if keep.any():
            local = torch.arange(lo - past, end - past)[keep].to(self.device, non_blocking=True)
            audio = (ids[lo:] == cfg.thinker.audio_token_id)[keep].to(self.device, non_blocking=True)
            talker = self.model.talker
            rows = torch.where(audio[:, None], talker.project_hidden(captured[local]), talker.project_text(x[local]))
            s.talker_users.append(rows)
