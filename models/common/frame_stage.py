"""The frame LM's stage: prefill and decode through frame_step.py. Each talker stream holds a row (slot) of the
repetition-penalty state `seen` [slots + 1, V] (its codebook-0 ids, updated on the device; the last: padding's)."""

from __future__ import annotations

from dataclasses import replace

import torch

from pipelines import kv_views
from pipelines.graphs import GraphRunner, Tensors
from pipelines.kv_cache import PagedKVCache
from pipelines.model_runner import Finish
from pipelines.sampling import sampling_rows
from pipelines.stage import StageConfig

from .frame import FrameTalker
from .frame_step import FramePrefill, FrameStep
from .prefill import PrefillCall, Prefills
from .speaking import FrameWork
from .work import NAN_MESSAGE


class FrameStage:
    def __init__(self, talker: FrameTalker, dtype: torch.dtype, kv: PagedKVCache, sc: StageConfig, eos: int,
                 suppress: torch.Tensor, slots: int = 1024, min_frames: int = 0) -> None:
        self.device, self.dtype, self.kv, self.eos = torch.device(sc.device), dtype, kv, eos
        self.suppress = suppress.to(self.device)
        self.seen = torch.zeros(slots + 1, suppress.shape[0], dtype=torch.bool, device=self.device)
        self.free = list(range(slots - 1, -1, -1))
        self.width, self.context = sc.graph_blocks, sc.graph_context
        step = FrameStep(talker, kv, self.seen, self.suppress, eos, min_frames)
        self.graph = GraphRunner("talker", step, step.inputs(dtype, self.width, kv.scratch_slot, slots), self.device,
                                 sc.buckets, sc.graphs)
        prefill = FramePrefill(step)
        self.prefill = Prefills("talker_prefill", prefill, lambda t, w: prefill.inputs(dtype, t, w, slots), kv,
                                self.device, sc.graphs)

    def capture(self, pool: object | None) -> object | None:
        return self.prefill.capture(self.graph.capture(pool))

    @property
    def slots_in_use(self) -> int:
        return self.seen.shape[0] - 1 - len(self.free)

    def _slots(self, works: list[FrameWork]) -> list[FrameWork]:
        """Give each work a penalty-state row on its first step; works that get none fail alone."""
        ready = []
        for w in works:
            if w.slot is None:
                if not self.free:
                    w.fail("server_busy", f"all {self.seen.shape[0] - 1} talker streams are in use")
                    continue
                w.slot, w.free_slot = self.free.pop(), self._free_slot
            ready.append(w)
        return ready

    def _free_slot(self, slot: int) -> None:
        self.seen[slot].zero_()
        self.free.append(slot)

    def _rows(self, works: list[FrameWork]) -> dict:
        """The inputs decode and prefill share: each row's frame number, penalty row and sampling."""
        opts = [w.turn.options for w in works]
        return {"frame": [len(w.turn.codes) for w in works], "slot": [w.slot for w in works],
                "no_eos": [o.ignore_eos for o in opts], **sampling_rows("t", [o.talker for o in opts]),
                **sampling_rows("p", [o.predictor for o in opts])}

    def decode(self, works: list[FrameWork]) -> Finish | None:
        if any(self.kv.length(w.key) >= self.context for w in works):  # its next token would not fit
            return None
        works = self._slots(works)
        if not works:
            return lambda: None
        x = self._join(works)  # every decode row's one new input, when each was just joined
        if x is None:
            x = torch.cat([w.inputs.tail(self.kv.length(w.key)) for w in works])
        rows = kv_views.rows(self.kv, [w.key for w in works], self.width) | self._rows(works) | {"x": x}
        out = self.graph(len(works), rows)
        return lambda: self._commit(works, out)

    def run(self, works: list[FrameWork], lengths: list[int], prefill: bool) -> None:
        self._join(works)
        for call in self.prefill.calls(works, lengths):
            self._prefill(call)

    def _prefill(self, call: PrefillCall) -> None:
        ready = {id(w) for w in self._slots([w for w, _ in call.group])}
        group = [(w, n) for w, n in call.group if id(w) in ready]  # the others failed alone (no stream slot)
        if not group:
            return
        works = [w for w, _ in group]
        rows = self.prefill.rows(replace(call, group=group), lambda w: w.inputs)
        self._commit(works, call.runner(len(group), rows | self._rows(works)))

    @staticmethod
    def _join(works: list[FrameWork]) -> torch.Tensor | None:
        """Each stream's next input from its two parts: all rows' adds in one op. Returns them [n, H] when every
        work had one (in the works' order)."""
        ready = [w for w in works if w.next is not None]
        if not ready:
            return None
        rows = torch.stack([w.next[0] for w in ready]) + torch.stack([w.next[1] for w in ready])
        for w, row in zip(ready, rows.unsqueeze(1).unbind(), strict=True):
            w.inputs.append(row)
            w.next = None
        return rows if len(ready) == len(works) else None

    def _commit(self, works: list[FrameWork], out: Tensors) -> None:
        rows = torch.cat((out["codes"], out["bad"][:, None].to(out["codes"].dtype)), dim=1).tolist()  # one sync
        for w, (*codes, bad), row, embed_sum in zip(works, rows, out["codes"].unbind(), out["embed_sum"].unbind(),
                                                    strict=True):
            if bad:
                w.fail("internal_error", f"talker: {NAN_MESSAGE}")
                continue
            w.next_embed = w.turn.on_frame(codes, row, embed_sum, self.eos)
