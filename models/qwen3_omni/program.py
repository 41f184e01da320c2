"""Qwen3-Omni in the pipeline: the turn flow over the stages that placement.py configures.

A turn's messages are rendered with the chat template (continuing the session's cached conversation),
its audio turned into log-mel features, and one Work per stage is registered. The stages then move it
along: encoder -> thinker (prefill of the new tokens only, then decode) -> talker (from the thinker's
first reply token) -> Code2Wav (audio of each frame as soon as it is final).
"""

from __future__ import annotations

import json
import logging
import time

import torch

from pipelines.kv_cache import PagedKVCache
from pipelines.pipeline import Emit, Pipeline
from pipelines.stage import Stage
from pipelines.types import Event, Message, Turn, TurnDone, TurnError

from . import chat
from .audio_features import audio_token_count, log_mel
from .code2wav_step import Code2WavStep, Code2WavWork
from .config import ConfigError
from .conversation import Session, TurnState
from .forced_call import CallWriter, forcing
from .model import Qwen3Omni, load_model
from .placement import STAGE_NAMES, TYPICAL_SESSION_TOKENS, PipelineConfig, checkpoint_sampling, kv_layouts
from .stages import EncoderStep, EncoderWork, TalkerWork, ThinkerWork, Work
from .talker_step import TalkerStep
from .thinker_step import ThinkerStep
from .tokenizer import Tokenizer
from .tools import assistant_text, merge_tool_results, tool_response_text, with_tools

log = logging.getLogger(__name__)
MAX_POSITIONS = 65536  # the thinker's max_position_embeddings in the released checkpoint
BYTES_PER_TOKEN = 4  # prompt text beyond 4 bytes per token of context is refused before tokenizing


class ContextTooLong(ValueError):
    pass


class Qwen3OmniProgram:
    def __init__(self, model: Qwen3Omni, tokenizer: Tokenizer, cfg: PipelineConfig) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.device, self.dtype = torch.device(cfg.device), getattr(torch, cfg.dtype)
        self.thinker_sampling = checkpoint_sampling(cfg.model)
        caches = {name: PagedKVCache(layout) for name, layout in kv_layouts(model, cfg).items()}
        sc = cfg.stage
        with torch.inference_mode():
            self.steps = {
                "audio_encoder": EncoderStep(model, self.device, self.dtype),
                "thinker": ThinkerStep(model, self.dtype, tokenizer.vocab_size, caches["thinker"], sc("thinker")),
                "talker": TalkerStep(model, self.dtype, caches["talker"], sc("talker")),
                "code2wav": Code2WavStep(model, self.device, self.dtype, graphs=sc("code2wav").graphs,
                                         buckets=sc("code2wav").buckets),
            }
        self.by_name: dict[str, Stage] = {n: Stage(sc(n), self.steps[n], caches.get(n)) for n in STAGE_NAMES}
        self.stages = [self.by_name[n] for n in STAGE_NAMES]
        self.sessions: dict[str, Session] = {}
        self.turns: dict[str, tuple[TurnState, list[tuple[Stage, Work]]]] = {}
        thinker = caches["thinker"].layout
        # tokens one conversation can ever hold
        self.max_context = min(thinker.num_blocks * thinker.block_size, MAX_POSITIONS)
        self.started = self.ended = 0
        self.capture_s = self.capture()

    def capture(self) -> float:
        """Capture every stage's fixed-shape steps (CUDA graphs on) in one shared pool; returns seconds."""
        start, pool = time.perf_counter(), None
        for stage in self.stages:
            pool = stage.runner.capture(pool)
        seconds = time.perf_counter() - start
        if pool is not None:
            log.info("CUDA graphs captured in %.1f s", seconds)
        return seconds

    def start_turn(self, turn: Turn, emit: Emit) -> None:
        """Register a turn's works, or refuse it (TurnError) before any work exists. Every turn started
        here ends with exactly one TurnDone or TurnError (`counters` counts both)."""
        self.started += 1

        def counted(event: Event) -> None:
            if isinstance(event, TurnDone | TurnError):
                self.ended += 1
            emit(event)

        session = self.sessions.get(turn.session_id) or Session(turn.session_id)
        if session.turn is not None:
            counted(TurnError(turn.turn_id, "session_busy", f"session {turn.session_id} already has an active turn"))
            return
        try:
            with torch.inference_mode():
                state, works = self._prepare(session, turn, counted)
        except ContextTooLong as e:
            return counted(TurnError(turn.turn_id, "context_too_long", str(e)))
        except (ValueError, ConfigError) as e:
            return counted(TurnError(turn.turn_id, "invalid_request", str(e)))
        except Exception as e:  # a bug in preparing one turn fails that turn alone
            log.exception("preparing turn %s failed", turn.turn_id)
            return counted(TurnError(turn.turn_id, "internal_error", f"{type(e).__name__}: {e}"))
        self.sessions[turn.session_id] = session
        session.turn = state
        self.turns[turn.turn_id] = (state, works)
        state.on_close = lambda: self._close(turn.turn_id)
        try:
            for stage, work in works:
                stage.add(work)
        except Exception as e:
            log.exception("registering turn %s failed", turn.turn_id)
            state.fail("internal_error", f"{type(e).__name__}: {e}")

    def _check_input(self, session: Session, turn: Turn) -> None:
        """Refuse text that is not Unicode, or a prompt that cannot fit, in time bounded by the limit."""
        if not turn.messages:
            raise ValueError("a turn needs at least one message")
        limit = BYTES_PER_TOKEN * self.max_context
        calls = [c.name + c.arguments for m in turn.messages for c in m.tool_calls]
        choice = turn.options.tool_choice
        texts = [m.text for m in turn.messages] + calls + [json.dumps([turn.options.tools, choice], ensure_ascii=False)]
        if sum(map(len, texts)) > limit:  # characters <= UTF-8 bytes: no need to encode a huge text
            raise ContextTooLong(f"the prompt's text is over {limit} bytes")
        try:
            size = sum(len(t.encode("utf-8")) for t in texts)
        except UnicodeEncodeError as e:
            raise ValueError(f"text is not valid Unicode ({e.reason} at character {e.start})") from None
        if size > limit:
            raise ContextTooLong(f"the prompt's text is {size} bytes, over {limit}")
        window = self.model.cfg.thinker.audio.n_window
        for m in turn.messages:
            if m.audio is None:
                continue
            if int(audio_token_count(m.audio.numel() // 160 + 1, window)) > self.max_context:
                raise ContextTooLong(f"{m.audio.numel() / 16000:.0f} s of audio cannot fit in the context")
            if not bool(torch.isfinite(m.audio).all()):
                raise ValueError("audio holds NaN or infinite samples")

    def _prepare(self, session: Session, turn: Turn, emit: Emit) -> tuple[TurnState, list[tuple[Stage, Work]]]:
        self._check_input(session, turn)
        opts = turn.options
        self.model.cfg.talker.speaker_id(opts.speaker)  # unknown speakers fail here, before any work
        features, turns = [], []
        for m in turn.messages:
            tokens = 0
            if m.audio is not None:
                feats, mask = log_mel([m.audio.float().cpu()])
                frames = int(mask.sum())
                features.append(feats[0, :, :frames])
                tokens = int(audio_token_count(frames, self.model.cfg.thinker.audio.n_window))
            turns.append(self._chat_turn(m, tokens))
        if opts.tools and not session.ids:
            turns = with_tools(turns, list(opts.tools), opts.tool_choice)
        im_end = self.model.cfg.im_end_token_id
        if not session.ids:
            prompt = chat.render(self.tokenizer, merge_tool_results(turns))
        else:
            closing = [] if session.ids[-1] == im_end else [im_end]  # a reply cut short still ends its turn
            prompt = chat.Prompt(tuple(closing)) + chat.render_continuation(self.tokenizer, merge_tool_results(turns))
        if (total := len(session.ids) + len(prompt)) >= self.max_context:
            raise ContextTooLong(f"{total} tokens leave no room to reply in a {self.max_context}-token context")
        if opts.thinker is None and self.thinker_sampling is not None and not opts.greedy:
            opts = type(opts)(**{**opts.__dict__, "thinker": self.thinker_sampling})
        state = TurnState(
            turn.turn_id, session, opts, emit, self.tokenizer.stream_decoder(skip_special=True), im_end,
            self.steps["thinker"].tts, prompt_ids=list(prompt.ids), cached_tokens=len(session.ids),
            audio_features=features, speaking=opts.audio, tool_call_id=self.tokenizer.special_ids["<tool_call>"],
            audio_token_id=self.model.cfg.thinker.audio_token_id,
        )
        writer = CallWriter.for_choice(self.tokenizer, opts.tools, opts.tool_choice)
        if writer is not None:
            state.force = forcing(writer, self.model.thinker.embed)
        works: list[tuple[Stage, Work]] = []
        s = self.by_name
        if features:
            works.append((s["audio_encoder"], EncoderWork(state)))
        works.append((s["thinker"], ThinkerWork(state, s["thinker"].kv)))
        if opts.audio:
            works.append((s["talker"], TalkerWork(state, s["talker"].kv, self.steps["talker"].prompt)))
            works.append((s["code2wav"], Code2WavWork(state)))
        if not features:  # last: the session changes only once nothing else can fail
            ids = torch.tensor([state.prompt_ids], device=self.device)
            state.on_prompt_embeds(self.model.thinker.embed(ids)[0])
        return state, works

    @staticmethod
    def _chat_turn(m: Message, audio_tokens: int) -> chat.Turn:
        if m.role == "tool":
            return chat.Turn("user", tool_response_text(m.text))
        return chat.Turn(m.role, assistant_text(m.text, m.tool_calls) if m.tool_calls else m.text, audio_tokens)

    def truncate_reply(self, session_id: str, turn_id: str, audio_end_ms: int) -> tuple[str, bool]:
        """Cut a reply back to what the listener heard (its first `audio_end_ms` of audio). The talker
        reads one reply token per codec frame, so the frames whose audio had begun carry the tokens
        that were heard. When this is the session's latest reply, its inputs and KV cache are rolled
        back to match. Returns (the heard text, whether the session was rolled back)."""
        session = self.sessions.get(session_id)
        if session is None or turn_id not in session.replies:
            raise KeyError(f"no reply {turn_id} in session {session_id}")
        if session.turn is not None and session.turn.turn_id == turn_id:
            session.turn.finish("cancelled")
        c2w = self.model.cfg.code2wav
        samples = audio_end_ms * 24
        frames = 0 if samples <= 0 else -(-(samples + self.model.code2wav.holdback) // c2w.samples_per_frame)
        start, reply = session.replies[turn_id]
        keep = max(0, min(len(reply), frames))
        text = self.tokenizer.decode(reply[:keep], skip_special=True)
        if start + len(reply) < len(session.ids) or session.turn is not None:
            return text, False  # later turns were built on the whole reply: the caller re-reads the conversation
        session.truncate(start + keep)
        del reply[keep:]
        kv = self.by_name["thinker"].kv
        kv.truncate(session.kv_key, min(kv.length(session.kv_key), start + keep))
        return text, True

    def abort_turn(self, turn_id: str) -> None:
        entry = self.turns.get(turn_id)
        if entry is not None:
            entry[0].finish("cancelled")

    def end_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        if session.turn is not None:
            session.turn.finish("cancelled")
        self.by_name["thinker"].kv.release(session.kv_key)

    def _close(self, turn_id: str) -> None:
        _, works = self.turns.pop(turn_id, (None, []))
        for stage, work in works:
            stage.remove(work)
            with torch.inference_mode():  # its state rows are inference tensors
                work.release()

    def counters(self) -> dict:
        """Turns started and ended (each ends once), live turns and sessions, KV blocks in use and live
        works per stage: what tests check returns to zero, and what /metrics can show."""
        return {
            "turns_started": self.started, "turns_ended": self.ended, "turns_active": len(self.turns),
            "sessions": len(self.sessions),
            "kv_blocks": {s.name: s.kv.layout.num_blocks - s.kv.num_free for s in self.stages if s.kv is not None},
            "works": {s.name: len(s.scheduler.works) for s in self.stages},
            "stream_slots": {n: self.steps[n].slots_in_use for n in ("talker", "code2wav")},
            "kv_capacity": self.capacity(),
        }

    def capacity(self, typical_tokens: int = TYPICAL_SESSION_TOKENS) -> dict[str, int]:
        """Tokens each KV cache holds, and how many conversations of `typical_tokens` fit at once."""
        tokens = {s.name: s.kv.layout.num_blocks * s.kv.layout.block_size for s in self.stages if s.kv is not None}
        return {**{f"{n}_tokens": t for n, t in tokens.items()}, "sessions": tokens["thinker"] // typical_tokens}

    def kv_check(self) -> dict[str, int]:
        """Integrity check of every KV cache; returns blocks in use per stage."""
        used = {}
        for stage in self.stages:
            if stage.kv is not None:
                stage.kv.check()
                used[stage.name] = stage.kv.layout.num_blocks - stage.kv.num_free
        return used


def build_pipeline(cfg: PipelineConfig, model: Qwen3Omni | None = None) -> Pipeline:
    """Load `cfg.model` (or use `model`, already on the device) and return its Pipeline, not started."""
    model = model or load_model(cfg.model, cfg.device, getattr(torch, cfg.dtype))
    tokenizer = Tokenizer.load(cfg.model)
    return Pipeline(Qwen3OmniProgram(model, tokenizer, cfg))
