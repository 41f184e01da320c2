"""The four Qwen3-Omni stages as the runtime sees them: a Work per turn and a StepModel per stage.

audio encoder -> thinker -> talker (+ code predictor) -> Code2Wav. Works read and write the turn's
TurnState; a StepModel runs one batch through its model and hands results on. One host sync per step
reads the sampled ids (stop conditions and events need them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipelines.kv_cache import BatchKV, PagedKVCache
from pipelines.sampling import Sampler, SamplingParams
from pipelines.types import AudioChunk

from .code2wav_stream import Code2WavStream
from .conversation import Rows, TurnState
from .model import Qwen3Omni
from .talker_prompt import TtsEmbeds, assistant_prefix, tts_embeds, tts_token_ids, user_mask

GREEDY = SamplingParams(greedy=True)


def pad_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """[n_i, H] rows -> [B, max n, H], zero padded."""
    t = max(r.shape[0] for r in rows)
    out = rows[0].new_zeros(len(rows), t, rows[0].shape[1])
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def last_rows(hidden: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    idx = torch.tensor(lengths, device=hidden.device) - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]


class Work:
    """Common part of a turn's work item in one stage."""

    keep_kv = False

    def __init__(self, turn: TurnState, key: str) -> None:
        self.turn = turn
        self.key = key

    def urgency(self) -> float:
        return self.turn.urgency()

    def fail(self, code: str, message: str) -> None:
        self.turn.fail(code, message)


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

    def pending(self) -> int:
        t = self.turn
        if not t.prompt_ready or t.finished or t.thinker_done:
            return 0
        return len(t.session.ids) - self.kv.length(self.key)


class TalkerWork(Work):
    def __init__(self, turn: TurnState, kv: PagedKVCache, prompt: Callable[[TurnState], torch.Tensor]) -> None:
        super().__init__(turn, f"talker:{turn.turn_id}")
        self.kv = kv
        self.prompt = prompt
        self.inputs = Rows()
        self.next_embed: torch.Tensor | None = None  # codec part of the next input, once a frame is made
        self.steps = 0  # decode inputs appended
        self.seen: torch.Tensor | None = None  # codebook-0 ids generated so far (repetition penalty)

    def pending(self) -> int:
        t = self.turn
        if t.finished or t.talker_done or not t.speaking:
            return 0
        if self.inputs.n == 0:
            if t.head_embeds is None:  # the talker starts on the thinker's first reply token
                return 0
            self.inputs.append(self.prompt(t))
        if self.next_embed is not None and self.kv.length(self.key) >= self.inputs.n:
            text = self._text(self.steps)
            if text is not None:
                self.inputs.append((self.next_embed + text)[None])
                self.next_embed, self.steps = None, self.steps + 1
        return self.inputs.n - self.kv.length(self.key)

    def _text(self, step: int) -> torch.Tensor | None:
        t = self.turn
        if step < len(t.trailing):
            return t.trailing[step]
        return t.tts.pad if t.thinker_done else None


class Code2WavWork(Work):
    def __init__(self, turn: TurnState, stream: Code2WavStream) -> None:
        super().__init__(turn, f"code2wav:{turn.turn_id}")
        self.stream = stream

    def pending(self) -> int:
        t = self.turn
        if t.finished or t.audio_done:
            return 0
        return len(t.frames_out) or int(t.talker_done)


class EncoderStep:
    def __init__(self, model: Qwen3Omni, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.device, self.dtype = model, device, dtype

    def run(self, works: list[EncoderWork], lengths: list[int], kv: BatchKV | None, prefill: bool) -> None:
        thinker = self.model.thinker
        for w in works:  # one turn per call: short audios encode differently when batched (as the reference)
            t = w.turn
            feats = [f.to(self.device, self.dtype) for f in t.audio_features]
            audio = thinker.audio_tower(feats) if feats else None
            ids = torch.tensor([t.prompt_ids], device=self.device)
            w.done = True
            t.on_prompt_embeds(thinker.embed_prompt(ids, audio)[0])


def nan_rows(logits: torch.Tensor) -> torch.Tensor:
    """[B] bool: rows whose logits hold a NaN (that row's turn ends; the rest of the batch goes on)."""
    return logits.isnan().any(dim=-1)


NAN_MESSAGE = "the model's output is not a number"


class ThinkerStep:
    def __init__(self, model: Qwen3Omni, device: torch.device, dtype: torch.dtype, vocab: int) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.vocab = vocab  # the tokenizer's size: wider lm_head rows are never sampled
        cfg = model.cfg
        self.capture = cfg.talker.accept_hidden_layer
        ids = torch.tensor(tts_token_ids(cfg), device=device)
        self.tts: TtsEmbeds = tts_embeds(model.talker, model.thinker.embed(ids))

    def run(self, works: list[ThinkerWork], lengths: list[int], kv: BatchKV | None, prefill: bool) -> None:
        thinker, talker = self.model.thinker, self.model.talker
        pasts = [w.kv.length(w.key) for w in works]
        x = pad_rows([w.turn.session.embeds.tail(p)[:n] for w, p, n in zip(works, pasts, lengths, strict=True)])
        hidden, captured = thinker(x, kv.positions, kv, capture_layer=self.capture)
        for i, w in enumerate(works):  # every turn's user rows: a later turn may speak
            self._talker_user_rows(w, pasts[i], lengths[i], x[i], captured[i])
        logits = thinker.logits(last_rows(hidden, lengths))[:, : self.vocab]
        params = [w.turn.options.thinker or GREEDY for w in works]
        steps = torch.tensor([len(w.turn.reply_ids) for w in works], device=self.device)
        ids = Sampler(params, self.device)(logits, steps, suppress=self._no_eos(works, logits.shape[-1]))
        embeds = thinker.embed(ids)
        projected = talker.project_text(embeds) if any(w.turn.speaking for w in works) else None
        ids = torch.where(nan_rows(logits), -1, ids)
        for i, (w, token) in enumerate(zip(works, ids.tolist(), strict=True)):
            if token < 0:
                w.fail("internal_error", f"thinker: {NAN_MESSAGE}")
                continue
            w.turn.on_token(token, embeds[i], None if projected is None else projected[i])

    def _no_eos(self, works: list[ThinkerWork], vocab: int) -> torch.Tensor | None:
        rows = [w.turn.options.ignore_eos for w in works]
        if not any(rows):
            return None
        mask = torch.zeros(len(works), vocab, dtype=torch.bool, device=self.device)
        mask[torch.tensor(rows, device=self.device), self.model.cfg.im_end_token_id] = True
        return mask

    def _talker_user_rows(self, w: ThinkerWork, past: int, n: int, x: torch.Tensor, captured: torch.Tensor) -> None:
        """Talker rows for the user-turn positions among the ones just fed (once per position)."""
        s, cfg = w.turn.session, self.model.cfg
        lo = max(past, s.talker_done_upto)
        end = min(past + n, len(s.ids) - len(w.turn.reply_ids))  # reply tokens are never user rows
        s.talker_done_upto = max(s.talker_done_upto, end)
        if lo >= end:
            return
        ids = torch.tensor(s.ids[:end], device=self.device)
        keep = user_mask(ids, cfg)[lo:]
        if keep.any():
            local = torch.arange(lo - past, end - past, device=self.device)[keep]
            audio = (ids[lo:] == cfg.thinker.audio_token_id)[keep]
            talker = self.model.talker
            rows = torch.where(audio[:, None], talker.project_hidden(captured[local]), talker.project_text(x[local]))
            s.talker_users.append(rows)


class TalkerStep:
    def __init__(self, model: Qwen3Omni, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        t = model.cfg.talker
        vocab = t.text.vocab_size
        self.eos = t.codec_eos_id
        self.suppress = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.suppress[vocab - 1024 :] = True
        self.suppress[self.eos] = False

    def prompt(self, turn: TurnState) -> torch.Tensor:
        cfg = self.model.cfg
        speaker = cfg.talker.speaker_id(turn.options.speaker)
        prefix = assistant_prefix(self.model.talker, cfg, turn.head_embeds, turn.tts, speaker)
        users = turn.session.talker_users
        return torch.cat((users.all(), prefix)) if users.n else prefix  # a conversation may have no user turn

    def run(self, works: list[TalkerWork], lengths: list[int], kv: BatchKV | None, prefill: bool) -> None:
        talker = self.model.talker
        pasts = [w.kv.length(w.key) for w in works]
        x = pad_rows([w.inputs.tail(p)[:n] for w, p, n in zip(works, pasts, lengths, strict=True)])
        last = last_rows(talker(x, kv.positions, kv), lengths)
        opts = [w.turn.options for w in works]
        frames = torch.tensor([len(w.turn.codes) for w in works], device=self.device)
        vocab = self.suppress.shape[0]
        seen = torch.stack([w.seen if w.seen is not None else self.suppress.new_zeros(vocab) for w in works])
        talker_params = [greedy_talker(o.talker) if o.greedy else o.talker for o in opts]
        suppress = self.suppress
        if any(o.ignore_eos for o in opts):
            suppress = suppress.expand(len(works), -1).clone()
            suppress[torch.tensor([o.ignore_eos for o in opts], device=self.device), self.eos] = True
        logits = talker.codec_logits(last)
        code0 = Sampler(talker_params, self.device)(logits, frames, seen, suppress)
        predictor = Sampler([GREEDY if o.greedy else o.predictor for o in opts], self.device)
        frame = talker.next_frame(last, code0, lambda logits, step: predictor(logits, frames * 16 + step))
        rows = torch.cat((frame.codes, nan_rows(logits)[:, None].to(frame.codes.dtype)), dim=1)  # one host sync
        for i, (w, (*codes, bad)) in enumerate(zip(works, rows.tolist(), strict=True)):
            if bad:
                w.fail("internal_error", f"talker: {NAN_MESSAGE}")
                continue
            if w.seen is None:
                w.seen = self.suppress.new_zeros(vocab)
            w.seen[codes[0]] = True
            w.next_embed = w.turn.on_frame(codes, frame.codes[i], frame.embed_sum[i], self.eos)


def greedy_talker(p: SamplingParams) -> SamplingParams:
    """The reference's greedy talker keeps its repetition penalty (and suppressed ids)."""
    return SamplingParams(greedy=True, repetition_penalty=p.repetition_penalty)


class Code2WavStep:
    def __init__(self, model: Qwen3Omni, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.device, self.dtype = model, device, dtype

    def run(self, works: list[Code2WavWork], lengths: list[int], kv: BatchKV | None, prefill: bool) -> None:
        for w in works:
            t = w.turn
            pieces = []
            if t.frames_out:
                codes = torch.stack(t.frames_out, dim=1)[None]  # [1, 16, n]
                t.frames_out.clear()
                pieces.append(w.stream.push(codes))
            if t.talker_done and not t.frames_out:
                pieces.append(w.stream.flush())
                t.audio_done = True
            pcm = torch.cat([p.reshape(-1) for p in pieces]).float().cpu().numpy() if pieces else None
            if pcm is not None and pcm.size:
                t.on_audio(AudioChunk(t.turn_id, pcm, len(t.codes)))
            t.maybe_finish()

