"""The talker stage: a turn's prompt prefill (`forward.TalkerPrefill`) and one whole codec frame per row
per decode step (`forward.TalkerFrame`), the only compute paths: fixed shapes (a CUDA graph per batch
bucket when graphs are on), or a prefill too long for them at its own shape, eagerly.

Each talker stream holds a row (slot) of the stage's repetition-penalty state, `seen` [slots + 1, V]:
the codebook-0 ids it has made, updated on the device by whichever path made the frame. The last row
is scratch for padding rows.
"""

from __future__ import annotations

import torch

from models.common.prefill import PrefillCall, Prefills, pad_rows
from pipelines import kv_views
from pipelines.graphs import GraphRunner, Tensors
from pipelines.kv_cache import BatchKV, PagedKVCache
from pipelines.sampling import SamplingParams
from pipelines.stage import StageConfig
from pipelines.step_sampling import sampling_rows

from .conversation import TurnState
from .forward import TalkerFrame, TalkerPrefill
from .model import Qwen3Omni
from .stages import GREEDY, NAN_MESSAGE, TalkerWork
from .talker_prompt import assistant_prefix


def greedy_talker(p: SamplingParams) -> SamplingParams:
    """The reference's greedy talker keeps its repetition penalty (and suppressed ids)."""
    return SamplingParams(greedy=True, repetition_penalty=p.repetition_penalty)


class TalkerStep:
    def __init__(self, model: Qwen3Omni, dtype: torch.dtype, kv: PagedKVCache, sc: StageConfig,
                 slots: int = 1024) -> None:
        self.model, self.device, self.dtype, self.kv = model, torch.device(sc.device), dtype, kv
        t = model.cfg.talker
        vocab = t.text.vocab_size
        self.eos = t.codec_eos_id
        self.suppress = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.suppress[vocab - 1024 :] = True
        self.suppress[self.eos] = False
        self.seen = torch.zeros(slots + 1, vocab, dtype=torch.bool, device=self.device)
        self.free = list(range(slots - 1, -1, -1))
        self.width = sc.graph_blocks
        step = TalkerFrame(model, kv, self.seen, self.suppress, self.eos)
        self.graph = GraphRunner("talker", step, step.inputs(dtype, self.width, kv.scratch_slot, slots), self.device,
                                 sc.buckets, sc.graphs)
        prefill = TalkerPrefill(step)
        self.prefill = Prefills("talker_prefill", prefill, lambda t, w: prefill.inputs(dtype, t, w, slots), kv,
                                self.device, sc.graphs)

    def capture(self, pool: object | None) -> object | None:
        return self.prefill.capture(self.graph.capture(pool))

    def prompt(self, turn: TurnState) -> torch.Tensor:
        cfg = self.model.cfg
        speaker = cfg.talker.speaker_id(turn.options.speaker)
        prefix = assistant_prefix(self.model.talker, cfg, turn.head_embeds, turn.tts, speaker)
        users = turn.session.talker_users
        return torch.cat((users.all(), prefix)) if users.n else prefix  # a conversation may have no user turn

    def _slots(self, works: list[TalkerWork]) -> list[TalkerWork]:
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

    @property
    def slots_in_use(self) -> int:
        return self.seen.shape[0] - 1 - len(self.free)

    def _free_slot(self, slot: int) -> None:
        self.seen[slot].zero_()
        self.free.append(slot)

    def decode(self, works: list[TalkerWork]) -> bool:
        if any(len(self.kv.seqs[w.key].blocks) > self.width for w in works):
            return False
        works = self._slots(works)
        if works:
            opts = [w.turn.options for w in works]
            rows = kv_views.rows(self.kv, [w.key for w in works], self.width) | {
                "x": torch.cat([w.inputs.tail(self.kv.length(w.key)) for w in works]),
                "frame": [len(w.turn.codes) for w in works], "slot": [w.slot for w in works],
                "no_eos": [o.ignore_eos for o in opts],
                **sampling_rows("t", [greedy_talker(o.talker) if o.greedy else o.talker for o in opts]),
                **sampling_rows("p", [GREEDY if o.greedy else o.predictor for o in opts]),
            }
            self._commit(works, self.graph(len(works), rows))
        return True

    def run(self, works: list[TalkerWork], lengths: list[int], kv: BatchKV | None, prefill: bool) -> None:
        for call in self.prefill.calls(works, lengths):
            self._prefill(call)

    def _prefill(self, call: PrefillCall) -> None:
        ready = {id(w) for w in self._slots([w for w, _ in call.group])}
        group = [(w, n) for w, n in call.group if id(w) in ready]  # the others failed alone (no stream slot)
        if not group:
            return
        works, opts = [w for w, _ in group], [w.turn.options for w, _ in group]
        x = pad_rows([w.inputs.tail(self.kv.length(w.key))[:n] for w, n in group], call.tokens)
        rows = kv_views.prefill_rows(self.kv, [(w.key, n) for w, n in group], call.tokens, call.blocks)
        rows |= {"x": x, "last": [n - 1 for _, n in group], "frame": [len(w.turn.codes) for w in works],
                 "slot": [w.slot for w in works], "no_eos": [o.ignore_eos for o in opts],
                 **sampling_rows("t", [greedy_talker(o.talker) if o.greedy else o.talker for o in opts]),
                 **sampling_rows("p", [GREEDY if o.greedy else o.predictor for o in opts])}
        self._commit(works, call.runner(len(group), rows))

    def _commit(self, works: list[TalkerWork], out: Tensors) -> None:
        rows = torch.cat((out["codes"], out["bad"][:, None].to(out["codes"].dtype)), dim=1).tolist()  # one sync
        for i, (w, (*codes, bad)) in enumerate(zip(works, rows, strict=True)):
            if bad:
                w.fail("internal_error", f"talker: {NAN_MESSAGE}")
                continue
            w.next_embed = w.turn.on_frame(codes, out["codes"][i], out["embed_sum"][i], self.eos)
