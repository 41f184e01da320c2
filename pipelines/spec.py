"""What a model declares up front, so the runtime and the gateway never need to know which model it is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .sampling import SamplingParams


@dataclass(frozen=True)
class ModelSpec:
    """`input_rate`: Hz of the mono audio it hears, 0 if none. `output_rate` and `frame_samples`: Hz of the
    audio it speaks and samples per codec frame, 0 if it does not speak. `sampling`: defaults per stage."""

    name: str  # the model id /v1/models reports by default
    family: str  # the model folder's name for itself (config.json's model_type)
    input_rate: int = 0
    output_rate: int = 0
    frame_samples: int = 0
    voices: tuple[str, ...] = ()
    default_voice: str = ""
    languages: tuple[str, ...] = ()
    instructions: bool = True  # follows instructions (a system prompt, or a speaking style)
    text_out: bool = True  # writes a text reply (a speech-only model does not)
    transcribes: bool = False  # can transcribe the audio it hears
    tools: bool = False  # can call functions
    reads_aloud: bool = False  # speaks a given text as it is (text to speech: /v1/audio/speech)
    clones: bool = False  # speaks in a voice cloned from reference audio (GenerationOptions.reference_audio)
    sampling: Mapping[str, SamplingParams] = field(default_factory=dict)
    tiny: str = ""  # the name of its tiny random-weight preset

    def __post_init__(self) -> None:
        if self.output_rate and (self.frame_samples < 1 or not self.voices):
            raise ValueError(f"{self.name}: a model that speaks declares its frame length and voices")
        if self.voices and self.default_voice not in self.voices:
            raise ValueError(f"{self.name}: default voice {self.default_voice!r} is not one of {self.voices}")

    @property
    def hears(self) -> bool:
        return self.input_rate > 0

    @property
    def speaks(self) -> bool:
        return self.output_rate > 0

    @property
    def frame_ms(self) -> float:
        return 1000 * self.frame_samples / self.output_rate if self.speaks else 0.0

    def voice(self, name: str) -> str:
        """The declared voice `name` names (any case; "" is the default); ValueError for an unknown one."""
        if not name:
            return self.default_voice
        found = next((v for v in self.voices if v.lower() == name.lower()), None)
        if found is None:
            raise ValueError(f"unknown voice {name!r} (this model has: {', '.join(self.voices) or 'none'})")
        return found

    def capabilities(self) -> dict:
        """The public description (/v1/models, /health): what it hears, speaks and can do."""
        return {"audio_in": self.hears, "audio_out": self.speaks, "text_out": self.text_out,
                "input_rate": self.input_rate, "output_rate": self.output_rate, "voices": list(self.voices),
                "default_voice": self.default_voice, "languages": list(self.languages),
                "instructions": self.instructions, "transcription": self.transcribes, "tools": self.tools,
                "speech": self.reads_aloud, "voice_cloning": self.clones}
