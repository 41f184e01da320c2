"""Qwen3-Omni's Works (one per turn and stage, over its TurnState) and the audio encoder's StepModel."""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.common.speaking import FrameWork
from models.common.work import Work
from pipelines.kv_cache import PagedKVCache

from .audio_stream import AudioStream, Tail, finish_all
from .conversation import TurnState
from .encoder_graph import EncoderGraph
from .model import Qwen3Omni


class EncoderWork(Work):
    def __init__(self, turn: TurnState) -> None:
        super().__init__(turn, f"encoder:{turn.turn_id}")
        self.done = False

    def pending(self) -> int:
        return 0 if self.done or self.turn.finished else 1


class ThinkerWork(Work):
    keep_kv = True  # the conversation stays cached between turns

    def __init__(self, turn: TurnState, kv: PagedKVCache) -> None:
        super().__init__(turn, turn.session.kv_key)
        self.kv = kv
        self.speaker: FrameWork | None = None  # the stream reading this reply: the thinker stays a few tokens ahead
        self.frame_s = 0.0  # audio a reply token stands for: the speaker reads one a frame

    def urgency(self) -> float:
        """The listener's audio buffered and, once playing, the frames its unread tokens will make: a stream near
        dry whose talker has text in hand does not need the thinker first (nor hold new turns' prefills back)."""
        u = self.turn.urgency()
        if self.speaker is None or not 0 <= u < float("inf"):
            return u
        return u + max(0, self.speaker.unread(len(self.turn.reply_ids))) * self.frame_s

    def pending(self) -> int:
        t = self.turn
        if not t.prompt_ready or t.finished or t.thinker_done:
            return 0
        n = len(t.session.ids) - self.kv.length(self.key)
        return 0 if n == 1 and self.speaker is not None and self.speaker.paces(len(t.reply_ids)) else n


class TalkerWork(FrameWork):
    def __init__(self, turn: TurnState, kv: PagedKVCache, prompt: Callable[[TurnState], torch.Tensor]) -> None:
        super().__init__(turn, kv)
        self.prompt = prompt

    def pending(self) -> int:
        t = self.turn
        if t.finished or t.talker_done or not t.speaking:
            return 0
        if self.inputs.n == 0:
            if t.head_embeds is None:  # the talker starts on the thinker's first reply token
                return 0
            self.inputs.append(self.prompt(t))
        if self.next_embed is not None:  # the last input made its frame (even if its cache was preempted since)
            k = self.steps
            if k >= len(t.trailing) and not t.thinker_done:
                return 0  # the next input waits for the thinker's next token; recomputing now would redo a frame
            self.feed(t.trailing[k] if k < len(t.trailing) else t.tts.pad)
        return self.unfed()


class EncoderStep:
    def __init__(self, model: Qwen3Omni, device: torch.device, dtype: torch.dtype, graphs: bool = False) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        tower = model.thinker.audio_tower
        self.graph = EncoderGraph(tower, dtype, device, graphs) if graphs and device.type == "cuda" else None

    def capture(self, pool: object | None) -> object | None:
        return pool if self.graph is None else self.graph.capture(pool)

    def run(self, works: list[EncoderWork], lengths: list[int], prefill: bool) -> None:
        """Turns whose audios all last a chunk (one second) or more encode in one call, exactly as alone; one
        with a shorter audio encodes alone (the reference pads a short chunk to the call's longest)."""
        chunk = 2 * self.model.cfg.thinker.audio.n_window
        tower = self.model.thinker.audio_tower
        ahead = [w for w in works if any(isinstance(f, AudioStream) for f in w.turn.audio_features)]
        tails = [self._tail(f) for w in ahead for f in w.turn.audio_features]
        outs = finish_all(tower, tails, self.graph)  # encoded as the audio arrived: the tails' last call, shared
        done = [(w, torch.cat([outs.pop(0) for _ in w.turn.audio_features])) for w in ahead]
        works = [w for w in works if w not in ahead]
        full = [w for w in works if all(f.shape[1] >= chunk for f in w.turn.audio_features)]
        groups = [full] * bool(full) + [[w] for w in works if w not in full]
        for group in groups:
            feats = [f.to(self.device, self.dtype) for w in group for f in w.turn.audio_features]
            audio = tower(feats) if feats else None
            start = 0
            for w in group:
                n = sum(int(tower.token_count(f.shape[1])) for f in w.turn.audio_features)
                done.append((w, None if audio is None else audio[start : start + n]))
                start += n
        self._embed(done)

    def _tail(self, audio: AudioStream | torch.Tensor) -> Tail:
        if isinstance(audio, AudioStream):
            return audio.finish_parts()[1]
        return Tail([self.model.thinker.audio_tower(audio.to(self.device, self.dtype))], [], None, 0, 0)

    def _embed(self, done: list[tuple[EncoderWork, torch.Tensor | None]]) -> None:
        """Each turn's prompt embeddings, its audio rows at its audio_pad ids (as `Thinker.embed_prompt`), for all
        turns in one lookup and one copy, the positions found on the host; then one host sync: the thinker's stream
        reads them, and stages share what a sync made (a turn alone took ~10 torch calls and 2 syncs)."""
        if not done:
            return
        pad = self.model.cfg.thinker.audio_token_id
        ids: list[int] = []
        at: list[int] = []
        for w, audio in done:
            if audio is not None:
                mine = [len(ids) + i for i, t in enumerate(w.turn.prompt_ids) if t == pad]
                if len(mine) != audio.shape[0]:
                    raise ValueError(f"{len(mine)} audio_pad tokens but {audio.shape[0]} audio embeddings")
                at += mine
            ids += w.turn.prompt_ids
        cuda = self.device.type == "cuda"
        index = torch.tensor(ids + at, dtype=torch.long, pin_memory=cuda).to(self.device, non_blocking=True)
        x = self.model.thinker.embed(index[: len(ids)])
        if at:
            x[index[len(ids) :]] = torch.cat([a for _, a in done if a is not None]).to(x.dtype)
        parts = [part.clone() for part in x.split([len(w.turn.prompt_ids) for w, _ in done])]  # not views of x
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        for (w, _), part in zip(done, parts, strict=True):
            w.done = True
            w.turn.on_prompt_embeds(part)

