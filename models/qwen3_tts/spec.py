"""What a Qwen3-TTS checkpoint declares, and a turn's settings resolved against it. DEFAULTS are the reference's
(qwen-tts 0.1.1), each overridden by generation_config.json (`subtalker_*`: the code predictor's). The text reaches
the talker whole for CustomVoice and VoiceDesign, streamed for Base, as the reference's generate_* default. Base
clones the voice of 24 kHz mono reference audio: from its x-vector alone, or with its transcript in context too
(the reference audio's codes in the prompt, and ahead of the reply's codes in the decoder)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from models.common.work import settle
from pipelines.sampling import SamplingParams
from pipelines.spec import ModelSpec
from pipelines.types import GenerationOptions

from .config import TtsConfig

OUTPUT_RATE = 24000
FRAME_SAMPLES = 1920  # 12.5 frames per second
DEFAULTS = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
                subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9,
                max_new_tokens=2048)
NAMES = {"custom_voice": "qwen3-tts-customvoice", "base": "qwen3-tts-base", "voice_design": "qwen3-tts-voicedesign"}


@dataclass(frozen=True)
class Generation:
    talker: SamplingParams
    predictor: SamplingParams
    max_new_tokens: int

    @classmethod
    def read(cls, model: str | Path | dict) -> Generation:
        if not isinstance(model, dict):
            path = Path(model) / "generation_config.json"
            model = json.loads(path.read_text()) if path.is_file() else {}
        g = {k: model.get(k, v) for k, v in DEFAULTS.items()}

        def params(prefix: str) -> SamplingParams:
            sample = bool(g[f"{prefix}dosample" if prefix else "do_sample"])
            return SamplingParams(greedy=not sample, temperature=float(g[f"{prefix}temperature"]),
                                  top_k=int(g[f"{prefix}top_k"] or 0), top_p=float(g[f"{prefix}top_p"]),
                                  repetition_penalty=float(g["repetition_penalty"]) if not prefix else 1.0)

        return cls(params(""), params("subtalker_"), int(g["max_new_tokens"]))


def tts_spec(cfg: TtsConfig, gen: Generation, tiny: str = "") -> ModelSpec:
    # Base and VoiceDesign have no named speakers: one voice, made by the clone or the instruction
    voices = tuple(name for name, _ in cfg.talker.speakers) or ("default",)
    languages = tuple(name for name, _ in cfg.talker.languages if "dialect" not in name)
    return ModelSpec(
        name=NAMES[cfg.model_type], family="qwen3_tts", output_rate=OUTPUT_RATE, frame_samples=FRAME_SAMPLES,
        voices=voices, default_voice=voices[0], languages=("auto", *languages),
        instructions=cfg.takes_instructions, text_out=False, reads_aloud=True, clones=cfg.model_type == "base",
        sampling={"talker": gen.talker, "predictor": gen.predictor}, tiny=tiny)


def describe(model: str) -> ModelSpec:
    """What `model` (the preset or a checkpoint directory) declares, from its config alone."""
    from .tiny import PRESETS, tiny_generation

    if model in PRESETS:
        return tts_spec(TtsConfig.from_hf(PRESETS[model]()), Generation.read(tiny_generation()), model)
    return tts_spec(TtsConfig.from_file(model), Generation.read(model))


@dataclass(frozen=True)
class TurnSettings:
    """A turn's options resolved; `speaker` "" when the model has no named speakers."""

    speaker: str
    language: str
    instructions: str
    talker: SamplingParams
    predictor: SamplingParams
    max_frames: int
    ignore_eos: bool
    background: bool

    @classmethod
    def resolve(cls, opts: GenerationOptions, spec: ModelSpec, cfg: TtsConfig, gen: Generation) -> TurnSettings:
        if not opts.audio:
            raise ValueError("this model only speaks: ask for audio output")
        if not spec.clones and (opts.reference_audio is not None or opts.reference_text):
            raise ValueError("this model cannot clone a voice from reference audio")
        if opts.reference_text and opts.reference_audio is None:
            raise ValueError("reference_text is the transcript of reference audio: give the reference audio too")
        if spec.clones and opts.reference_audio is None:
            raise ValueError("this model speaks in a cloned voice: give reference audio (24 kHz)")
        if opts.reference_text and not opts.reference_text.strip():
            raise ValueError("reference_text is blank: give what the reference audio says, or no reference_text "
                             "to clone from the audio alone")
        voice = spec.voice(opts.voice)
        speaker = voice if cfg.talker.speakers else ""
        language = (opts.language or "auto").lower()
        if language not in spec.languages:
            raise ValueError(f"unknown language {opts.language!r} (this model has: {', '.join(spec.languages)})")
        if opts.instructions and not spec.instructions:
            raise ValueError("this model takes no instructions")
        s = settle({n: opts.sampling.get(n, getattr(gen, n)) for n in ("talker", "predictor")}, opts)
        # the reference makes max_new_tokens - 1 frames when no EOS comes (the last token's frame is never made)
        frames = min(opts.max_frames, max(1, gen.max_new_tokens - 1))
        return cls(speaker, language, opts.instructions, s["talker"], s["predictor"], frames, opts.ignore_eos,
                   opts.background)
