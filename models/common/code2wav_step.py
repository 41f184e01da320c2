"""The Code2Wav stage: each speaking turn's oldest waiting frame, batched across turns (first frames in one fixed-shape
call, later ones in another), each turn's stream in a Code2WavSlots slot until it ends."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from pipelines.graphs import GraphRunner, Input
from pipelines.stage import StageConfig
from pipelines.types import AudioChunk

from .code2wav import Code2Wav
from .code2wav_batch import Code2WavSlots
from .work import Turn, Work


class SpeakingTurn(Turn, Protocol):
    turn_id: str
    frames_out: list[torch.Tensor]  # [Q] codes per frame, oldest first
    talker_done: bool  # no frame will follow those in frames_out
    rate: int  # output samples per second
    audio_done: bool
    finished: bool

    def on_audio(self, chunk: AudioChunk) -> None: ...

    def maybe_finish(self) -> bool: ...


class Code2WavWork(Work):
    def __init__(self, turn: SpeakingTurn, prefix: torch.Tensor | None = None) -> None:
        super().__init__(turn, f"code2wav:{turn.turn_id}")
        self.turn: SpeakingTurn = turn
        # [R, Q] codes decoded ahead of the turn's, their audio not played (a cloned voice's reference audio);
        # exact for a decoder of holdback 0 (no look-ahead): the first sample played is the turn's first frame's
        self.prefix = prefix
        self.pushed = 0  # frames decoded so far; `slot`: the stream's state in the decoder, from its first frame

    def pending(self) -> int:
        """1 while a frame waits (or the end): a step decodes one frame a row, so a stream a frame behind is no
        prefill; counted as one it would split every later step's batch in two, or wait behind the others'."""
        t = self.turn
        if t.finished or t.audio_done:
            return 0
        return int(bool(t.frames_out) or t.talker_done)


class Code2WavStep:
    def __init__(self, code2wav: Code2Wav, sc: StageConfig, dtype: torch.dtype, slots: int = 256) -> None:
        self.device = device = torch.device(sc.device)
        self.streams = s = Code2WavSlots(code2wav, slots, device, dtype)
        q = code2wav.cfg.num_quantizers
        inputs = {"slot": Input((), torch.long, s.scratch), "codes": Input((q,), torch.long, 0, on_device=True)}
        self.later = GraphRunner("code2wav", lambda b: {"pcm": s.step(b["slot"], b["codes"])}, inputs, device,
                                 sc.buckets, sc.graphs)
        self.first = GraphRunner("code2wav_first", lambda b: {"pcm": s.step(b["slot"], b["codes"], first=True)},
                                 inputs, device, sc.buckets, sc.graphs)

    @property
    def slots_in_use(self) -> int:
        return self.streams.scratch - self.streams.free_slots

    def capture(self, pool: object | None) -> object | None:
        return self.first.capture(self.later.capture(pool))

    def run(self, works: list[Code2WavWork], lengths: list[int], prefill: bool) -> None:
        for w in works:
            if w.slot is None and w.turn.frames_out:
                if not self.streams.free_slots:
                    w.fail("server_busy", f"all {self.streams.scratch} Code2Wav streams are in use")
                    continue
                w.slot, w.free_slot = self.streams.open(), self.streams.close
                if w.prefix is not None:
                    self.streams.push(w.slot, w.prefix.T[None].to(self.device))
        works = [w for w in works if not w.turn.finished]
        first = [w for w in works if w.turn.frames_out and w.pushed == 0 and w.prefix is None]
        later = [w for w in works if w.turn.frames_out and (w.pushed > 0 or w.prefix is not None)]
        for group, runner in ((first, self.first), (later, self.later)):
            if group:
                self._decode(group, runner)
        for w in works:
            t = w.turn
            if t.talker_done and not t.frames_out:
                t.audio_done = True  # the stream's last `holdback` samples would need a frame after the end
            t.maybe_finish()

    def _decode(self, group: list[Code2WavWork], runner: GraphRunner) -> None:
        codes = torch.stack([w.turn.frames_out.pop(0) for w in group])
        out = runner(len(group), {"slot": np.asarray([w.slot for w in group]), "codes": codes})
        pcm = out["pcm"].float().cpu().numpy()
        for i, w in enumerate(group):
            w.pushed += 1
            w.turn.on_audio(AudioChunk(w.turn.turn_id, pcm[i], w.pushed, w.turn.rate))
