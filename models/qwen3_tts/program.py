"""Qwen3-TTS in the pipeline: a turn reads its last message's text aloud through a talker stage (the frame
LM) and a Code2Wav stage. Sessions keep nothing between turns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.common.code2wav_step import Code2WavStep, Code2WavWork
from models.common.fp8 import fp8_experts_
from models.common.gpu_memory import kv_tokens
from models.common.tokenizer import Tokenizer
from pipelines.kv_cache import KVLayout, PagedKVCache
from pipelines.pipeline import Emit, Pipeline
from pipelines.program import ContextTooLong, StagedProgram
from pipelines.stage import Stage, StageConfig
from pipelines.types import Turn

from .model import Qwen3Tts, load_model
from .prompt import TextIds, build_prompt
from .spec import Generation, TurnSettings, tts_spec
from .stages import TalkerStep, TalkerWork
from .state import Session, TurnState
from .tiny import PRESETS, tiny_generation

MAX_TEXT_CHARS = 16384  # refused before tokenizing
KV_HEADROOM_GIB = 4.0


@dataclass(frozen=True)
class TtsPipelineConfig:
    model: str
    device: str
    dtype: str
    talker: StageConfig
    code2wav: StageConfig
    kv_memory_gib: float | None = None

    @classmethod
    def on(cls, model: str, device: str, dtype: str | None = None, graphs: bool | None = None,
           kv_memory_gib: float | None = None, **overrides: dict) -> TtsPipelineConfig:
        if unknown := set(overrides) - {"talker", "code2wav"}:
            raise ValueError(f"Qwen3-TTS has stages talker and code2wav, not {sorted(unknown)}")
        cuda = device.startswith("cuda")
        graphs = cuda if graphs is None else graphs
        talker = StageConfig(**{**dict(name="talker", device=device, max_batch=64, kv_blocks=1024, graphs=graphs,
                                       graph_context=4096), **overrides.get("talker", {})})
        code2wav = StageConfig(**{**dict(name="code2wav", device=device, max_batch=64, graphs=graphs),
                                  **overrides.get("code2wav", {})})
        if cuda and kv_memory_gib is None and "kv_blocks" not in overrides.get("talker", {}):
            kv_memory_gib = -1.0  # from free memory once the weights are loaded
        return cls(model, device, dtype or ("bfloat16" if cuda else "float32"), talker, code2wav, kv_memory_gib)

    def kv_layout(self, model: Qwen3Tts) -> KVLayout:
        t, sc = model.cfg.talker.text, self.talker
        dtype = getattr(torch, self.dtype)
        blocks = sc.kv_blocks
        if self.kv_memory_gib is not None:
            tokens = kv_tokens(self.kv_memory_gib, KV_HEADROOM_GIB, self.device, {"talker": t}, dtype, {"talker": 1.0})
            blocks = tokens["talker"] // sc.block_size
        return KVLayout(t.num_hidden_layers, t.num_key_value_heads, t.head_dim, blocks, sc.block_size, dtype,
                        self.device)

    def stages(self, model: Qwen3Tts) -> list[Stage]:
        dtype = getattr(torch, self.dtype)
        kv = PagedKVCache(self.kv_layout(model))
        with torch.inference_mode():
            talker = TalkerStep(model.talker, model.cfg, dtype, kv, self.talker)
            code2wav = Code2WavStep(model.code2wav, self.code2wav, dtype)
        return [Stage(self.talker, talker, kv), Stage(self.code2wav, code2wav, None)]


class Qwen3TtsProgram(StagedProgram):
    def __init__(self, model: Qwen3Tts, tokenizer: Tokenizer, gen: Generation, cfg: TtsPipelineConfig) -> None:
        if model.code2wav is None:
            raise ValueError("Qwen3-TTS needs its speech tokenizer's decoder to speak")
        self.model, self.tokenizer, self.gen, self.cfg = model, tokenizer, gen, cfg
        stages = cfg.stages(model)
        super().__init__(tts_spec(model.cfg, gen, cfg.model if cfg.model in PRESETS else ""), stages,
                         session_stage="talker")
        layout = stages[0].kv.layout
        self.max_context = layout.num_blocks * layout.block_size
        self.capture_s = self.capture()

    def new_session(self, session_id: str) -> Session:
        return Session(session_id)

    def extra_counters(self) -> dict:
        return {"stream_slots": {s.name: s.runner.model.slots_in_use for s in self.stages}}

    def prepare(self, session: Session, turn: Turn, emit: Emit) -> tuple[TurnState, list]:
        opts = TurnSettings.resolve(turn.options, self.spec, self.model.cfg, self.gen)
        text = self._text(turn)
        ref_text = turn.options.reference_text  # resolve() refused what this model cannot take
        if len(ref_text) > MAX_TEXT_CHARS:
            raise ContextTooLong(f"the reference text is over {MAX_TEXT_CHARS} characters")
        ids = TextIds.of(self.tokenizer, text, opts.instructions, ref_text)
        cfg, wave = self.model.cfg, turn.options.reference_audio
        speaker, reference = self.model.speaker_row(wave, opts.speaker), None
        if ref_text:  # in context (Base, with its audio): the reference audio's codes lead the prompt and decoder
            reference = self.model.speech_tokenizer.encode(wave.clamp(-1, 1), self.spec.output_rate)
        prompt = build_prompt(self.model.talker, cfg, ids, cfg.talker.language_id(opts.language, opts.speaker),
                              speaker, streamed=cfg.model_type == "base", reference=reference)
        if (total := prompt.embeds.shape[0] + opts.max_frames) > self.max_context:
            raise ContextTooLong(f"{total} talker positions do not fit the {self.max_context}-token cache")
        state = TurnState(turn.turn_id, session, opts, emit, prompt, text, tuple(ids.text),
                          len(ids.ids) + len(ids.instruction) + len(ids.reference), self.spec.output_rate)
        s = self.by_name
        return state, [(s["talker"], TalkerWork(state, s["talker"].kv)),
                       (s["code2wav"], Code2WavWork(state, reference))]

    @staticmethod
    def _text(turn: Turn) -> str:
        if not turn.messages:
            raise ValueError("a turn needs at least one message")
        if any(m.audio is not None for m in turn.messages):
            raise ValueError("this model reads text aloud; it does not hear audio")
        text = turn.messages[-1].text
        if len(text) > MAX_TEXT_CHARS:
            raise ContextTooLong(f"the text is over {MAX_TEXT_CHARS} characters")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text is not valid Unicode ({e.reason} at character {e.start})") from None
        if not text.strip():
            raise ValueError("there is no text to read")
        return text

    def truncate_reply(self, session_id: str, turn_id: str, audio_end_ms: int) -> tuple[str, bool]:
        """A reading keeps no conversation: nothing to roll back; the text read is returned whole."""
        session = self.sessions.get(session_id)
        turn = session.turn if session is not None else None
        if turn is None or turn.turn_id != turn_id:
            raise KeyError(f"no reply {turn_id} in session {session_id}")
        turn.finish("cancelled")
        return turn.text, False


def build(model: str, device: str = "cpu", dtype: str | None = None, graphs: bool | None = None,
          kv_memory_gib: float | None = None, quantization: str | None = None, **stage_overrides: dict) -> Pipeline:
    """The registry's entry point: `model` ('tiny-tts' or a checkpoint directory) on `device`'s defaults."""
    cfg = TtsPipelineConfig.on(model, device, dtype, graphs, kv_memory_gib, **stage_overrides)
    net, tokenizer, gen = load(model, cfg)
    if quantization:
        fp8_experts_(net)
    return Pipeline(Qwen3TtsProgram(net, tokenizer, gen, cfg))


def load(model: str, cfg: TtsPipelineConfig) -> tuple[Qwen3Tts, Tokenizer, Generation]:
    """`model` (the preset or a checkpoint directory) on `cfg`'s device, its tokenizer and generation defaults."""
    net = load_model(model, cfg.device, getattr(torch, cfg.dtype))
    preset = model in PRESETS
    tokenizer = Tokenizer.builtin() if preset else Tokenizer.load(model)
    return net, tokenizer, Generation.read(tiny_generation() if preset else model)
