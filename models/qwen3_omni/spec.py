"""What Qwen3-Omni declares to the runtime and the gateway, and a turn's settings resolved against it. DEFAULTS
are the reference's sampling; generation_config.json overrides them as transformers' `generate` routes keys:
`thinker_*` to the thinker, `talker_*` to the talker (plain keys reach neither)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from models.common.work import GREEDY, settle
from pipelines.sampling import SamplingParams
from pipelines.spec import ModelSpec
from pipelines.types import GenerationOptions

from .config import OmniConfig

INPUT_RATE = 16000  # the audio encoder's log-mel front end reads 16 kHz
OUTPUT_RATE = 24000  # Code2Wav's samples per second
DEFAULTS = {"thinker": GREEDY, "talker": SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05),
            "predictor": SamplingParams(top_k=50, top_p=0.8)}


def checkpoint_sampling(model: str, stage: str, default: SamplingParams) -> SamplingParams:
    """`stage`'s sampling from the checkpoint's generation_config.json `{stage}_*` keys over `default`."""
    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return default
    g = {k[len(stage) + 1:]: v for k, v in json.loads(path.read_text()).items() if k.startswith(f"{stage}_")}
    if not g:
        return default
    sample = g.get("do_sample", not default.greedy)
    return SamplingParams(greedy=not sample, temperature=float(g.get("temperature", default.temperature)),
                          top_k=int(g.get("top_k", default.top_k) or 0), top_p=float(g.get("top_p", default.top_p)),
                          repetition_penalty=float(g.get("repetition_penalty", default.repetition_penalty)))


def describe(model: str) -> ModelSpec:
    """What `model` (a preset or a checkpoint directory) declares, from its config alone (no weights)."""
    from .tiny import PRESETS

    return omni_spec(OmniConfig.from_hf(PRESETS[model]()) if model in PRESETS else OmniConfig.from_file(model), model)


def omni_spec(cfg: OmniConfig, model: str) -> ModelSpec:
    speaks = cfg.talker is not None
    sampling = {n: checkpoint_sampling(model, n, p) for n, p in DEFAULTS.items() if speaks or n == "thinker"}
    voices = tuple(name for name, _ in cfg.talker.speakers) if speaks else ()
    return ModelSpec(
        name="qwen3-omni" if speaks else "qwen3-omni-thinker", family="qwen3_omni_moe", input_rate=INPUT_RATE,
        output_rate=OUTPUT_RATE if speaks else 0, frame_samples=cfg.code2wav.samples_per_frame if speaks else 0,
        voices=voices, default_voice="ethan" if "ethan" in voices else (voices[0] if voices else ""),
        instructions=True, text_out=True, transcribes=True, tools=True, sampling=sampling,
        tiny="tiny" if speaks else "tiny-thinker")


@dataclass(frozen=True)
class TurnSettings:
    """A turn's options, each stage's sampling resolved (the request's, else the model's) and its voice a speaker."""

    audio: bool
    speaker: str
    thinker: SamplingParams
    talker: SamplingParams
    predictor: SamplingParams
    greedy: bool
    max_text_tokens: int
    max_frames: int
    ignore_eos: bool
    background: bool
    tools: tuple[dict, ...]
    tool_choice: str | dict

    @classmethod
    def resolve(cls, opts: GenerationOptions, spec: ModelSpec) -> TurnSettings:
        if opts.audio and not spec.speaks:
            raise ValueError("this model replies in text only: ask for text output (output_modalities ['text'])")
        if (opts.reference_audio is not None or opts.reference_text) and not spec.clones:
            raise ValueError("this model cannot clone a voice from reference audio")
        speaker = spec.voice(opts.voice) if spec.speaks else ""
        get = settle({n: opts.sampling.get(n, spec.sampling.get(n, DEFAULTS[n])) for n in DEFAULTS}, opts)
        return cls(opts.audio, speaker, get["thinker"], get["talker"], get["predictor"], opts.greedy,
                   opts.max_text_tokens, opts.max_frames, opts.ignore_eos, opts.background, opts.tools,
                   opts.tool_choice)
