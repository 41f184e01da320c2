"""Qwen3-Omni in the pipeline: a turn's messages rendered with the chat template (continuing the cached
conversation), its audio as log-mel features, one Work per stage: encoder -> thinker -> talker (from the
first reply token) -> Code2Wav (each frame's audio once final). Without a talker it replies in text."""

from __future__ import annotations

import json
import logging

import numpy as np
import torch

from models.common import chat
from models.common.code2wav_step import Code2WavStep, Code2WavWork
from models.common.speaking import FrameWork
from models.common.tokenizer import Tokenizer
from pipelines.kv_cache import PagedKVCache
from pipelines.pipeline import Emit, Pipeline
from pipelines.program import ContextTooLong, StagedProgram
from pipelines.stage import Stage
from pipelines.types import Message, Turn
from pipelines.voice import Voice, spoken_by

from .audio_features import audio_token_count, log_mel
from .audio_stream import AudioStream
from .conversation import Session, SessionMark, TurnState
from .forced_call import CallWriter, forcing
from .model import Qwen3Omni, load_model
from .placement import PipelineConfig, kv_layouts
from .spec import INPUT_RATE, TurnSettings, omni_spec
from .stages import EncoderStep, EncoderWork, TalkerWork, ThinkerWork, Work
from .talker_step import TalkerStep
from .thinker_step import ThinkerStep
from .tiny import PRESETS
from .tools import assistant_text, merge_tool_results, tool_response_text, with_tools

log = logging.getLogger(__name__)
MAX_POSITIONS = 65536  # the thinker's max_position_embeddings in the released checkpoint
BYTES_PER_TOKEN = 4  # prompt text beyond 4 bytes per token of context is refused before tokenizing


class Qwen3OmniProgram(StagedProgram):
    def __init__(self, model: Qwen3Omni, tokenizer: Tokenizer, cfg: PipelineConfig, voice: Voice | None = None) -> None:
        """`voice`: another model's talker and codec speak the replies, in place of this model's own."""
        self.model, self.tokenizer, self.cfg, self.voice = model, tokenizer, cfg, voice
        self.ahead = {"turns": 0, "chunks_cached": 0}  # turns whose audio came encoded as it arrived
        self.device, self.dtype = torch.device(cfg.device), getattr(torch, cfg.dtype)
        if voice is not None:
            voice.reads(tokenizer.backend.get_vocab(with_added_tokens=True))
            model.talker = model.code2wav = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # their memory counts as free when the KV caches are sized
        caches = {name: PagedKVCache(layout) for name, layout in kv_layouts(model, cfg).items()}
        sc = cfg.stage
        with torch.inference_mode():
            self.steps = {
                "audio_encoder": EncoderStep(model, self.device, self.dtype, sc("audio_encoder").graphs),
                "thinker": ThinkerStep(model, self.dtype, tokenizer.vocab_size, caches["thinker"], sc("thinker")),
            }
            if model.talker is not None:
                self.steps["talker"] = TalkerStep(model, self.dtype, caches["talker"], sc("talker"))
                self.steps["code2wav"] = Code2WavStep(model.code2wav, sc("code2wav"), self.dtype)
        stages = [Stage(sc(n), self.steps[n], caches.get(n)) for n in cfg.stage_names(model.talker is not None)]
        spec = omni_spec(model.cfg, cfg.model)
        if voice is not None:
            spec, stages = spoken_by(spec, voice.spec), stages + voice.stages
            self.steps.update({s.name: s.runner.model for s in voice.stages})
        self.holdback = voice.holdback if voice else model.code2wav.holdback if model.code2wav else None
        super().__init__(spec, stages, session_stage="thinker")
        thinker = caches["thinker"].layout
        self.max_context = min(thinker.num_blocks * thinker.block_size, MAX_POSITIONS)
        self.capture_s = self.capture()

    def new_session(self, session_id: str) -> Session:
        return Session(session_id)

    def audio_ahead(self) -> AudioStream:
        return AudioStream(self.model.thinker.audio_tower)

    def mark(self, session: Session) -> SessionMark:
        return SessionMark(len(session.ids), session.talker_users.n, session.talker_done_upto,
                           self.by_name["thinker"].kv.length(session.kv_key))

    def roll_back(self, session: Session, mark: SessionMark, turn_id: str) -> None:
        session.truncate(mark.ids)
        session.talker_users.truncate(mark.talker_rows)
        session.talker_done_upto = mark.talker_done_upto
        session.replies.pop(turn_id, None)
        kv = self.by_name["thinker"].kv
        if mark.kv_length == 0:
            kv.release(session.kv_key)
        else:
            kv.truncate(session.kv_key, mark.kv_length)

    def extra_counters(self) -> dict:
        return {"stream_slots": {n: self.steps[n].slots_in_use for n in ("talker", "code2wav") if n in self.steps},
                "audio_ahead": dict(self.ahead)}

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
                raise ContextTooLong(f"{m.audio.numel() / INPUT_RATE:.0f} s of audio cannot fit in the context")
            if not _finite(m.audio):
                raise ValueError("audio holds NaN or infinite samples")

    def prepare(self, session: Session, turn: Turn, emit: Emit) -> tuple[TurnState, list[tuple[Stage, Work]]]:
        self._check_input(session, turn)
        opts = TurnSettings.resolve(turn.options, self.spec)  # unknown voices fail here, before any work
        features, turns = [], []
        for m in turn.messages:
            frames = 0
            if isinstance(m.ahead, AudioStream) and m.audio is not None and m.audio.numel() > 200 \
                    and m.ahead.holds(m.audio):
                features.append(m.ahead)  # encoded as it arrived: the encoder step finishes only the tail
                frames = m.audio.numel() // 160
            elif m.audio is not None:
                feats, mask = log_mel([m.audio.float().cpu()])
                frames = int(mask.sum())
                features.append(feats[0, :, :frames])
            turns.append(self._chat_turn(m, int(audio_token_count(frames, self.model.cfg.thinker.audio.n_window))))
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
        ahead = [f for f in features if isinstance(f, AudioStream)]
        self.ahead["turns"] += bool(ahead)
        self.ahead["chunks_cached"] += sum(f.cached_chunks for f in ahead)  # encoded before the commit
        state = TurnState(turn.turn_id, session, opts, emit, self.tokenizer.stream_decoder(skip_special=True), im_end,
                          self.steps["thinker"].tts, self.spec.output_rate, prompt_ids=list(prompt.ids),
                          cached_tokens=len(session.ids), audio_features=features, speaking=opts.audio,
                          tool_call_id=self.tokenizer.special_ids["<tool_call>"],
                          audio_token_id=self.model.cfg.thinker.audio_token_id)
        writer = CallWriter.for_choice(self.tokenizer, opts.tools, opts.tool_choice)
        if writer is not None:
            state.force = forcing(writer, self.model.thinker.embed)
        s = self.by_name
        thinker = ThinkerWork(state, s["thinker"].kv)
        works: list[tuple[Stage, Work]] = [(s["audio_encoder"], EncoderWork(state))] if features else []
        works.append((s["thinker"], thinker))
        if opts.audio and self.voice is not None:
            works += self.voice.works(state, turn.options)
        elif opts.audio:
            works.append((s["talker"], TalkerWork(state, s["talker"].kv, self.steps["talker"].prompt)))
            works.append((s["code2wav"], Code2WavWork(state)))
        thinker.speaker = next((w for _, w in works if isinstance(w, FrameWork)), None)
        thinker.frame_s = self.spec.frame_ms / 1e3
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
        """The talker reads one reply token per codec frame, so the frames whose audio had begun carry the
        heard tokens; the session's latest reply is rolled back to them (inputs and KV cache)."""
        session = self.sessions.get(session_id)
        if session is None or turn_id not in session.replies:
            raise KeyError(f"no reply {turn_id} in session {session_id}")
        if session.turn is not None and session.turn.turn_id == turn_id:
            session.turn.finish("cancelled")
        start, reply = session.replies[turn_id]
        frames = len(reply)  # a text reply is kept whole
        if self.holdback is not None:
            samples = audio_end_ms * self.spec.output_rate // 1000
            frames = 0 if samples <= 0 else -(-(samples + self.holdback) // self.spec.frame_samples)
        keep = max(0, min(len(reply), frames))
        text = self.tokenizer.decode(reply[:keep], skip_special=True)
        if start + len(reply) < len(session.ids) or session.turn is not None:
            return text, False  # later turns were built on the whole reply: the caller re-reads the conversation
        session.truncate(start + keep)
        del reply[keep:]
        kv = self.by_name["thinker"].kv
        kv.truncate(session.kv_key, min(kv.length(session.kv_key), start + keep))
        return text, True


def build_pipeline(cfg: PipelineConfig, model: Qwen3Omni | None = None, voice: Voice | None = None) -> Pipeline:
    """Load `cfg.model` (or use `model`, already on the device) and return its Pipeline, not started."""
    model = model or load_model(cfg.model, cfg.device, getattr(torch, cfg.dtype))
    tokenizer = Tokenizer.builtin() if cfg.model in PRESETS else Tokenizer.load(cfg.model)
    return Pipeline(Qwen3OmniProgram(model, tokenizer, cfg, voice))


def build(model: str, device: str = "cpu", dtype: str | None = None, graphs: bool | None = None,
          kv_memory_gib: float | None = None, voice: Voice | None = None, quantization: str | None = None,
          **stage_overrides: dict) -> Pipeline:
    """The registry's entry point: `model` ('tiny', 'tiny-thinker' or a checkpoint) on `device`'s defaults."""
    cfg = PipelineConfig.on(model, device, dtype, graphs, kv_memory_gib, **stage_overrides)
    net = load_model(cfg.model, cfg.device, getattr(torch, cfg.dtype), quantization=quantization, speaks=voice is None)
    return build_pipeline(cfg, net, voice=voice)


def _finite(x: torch.Tensor) -> bool:
    """`torch.isfinite(x).all()`; through numpy for CPU float tensors (a turn's audio, checked on the engine thread
    on the way to the first audio): 10 us for 3 s, not 130."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return bool(np.isfinite(x.detach().numpy()).all())
    return bool(torch.isfinite(x).all())
