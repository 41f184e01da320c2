"""The served model's `ModelSpec` against a session's or response's config: what it cannot do is refused, not tried."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipelines.spec import ModelSpec

from .protocol import ProtocolError

if TYPE_CHECKING:
    from .voices import CustomVoices

# OpenAI's built-in voices: a client written for OpenAI sends one of these; each gets the model's default voice
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")


def model_voice(voice: Any, spec: ModelSpec, where: str = "session.audio.output.voice") -> str:
    """The model's voice for a session's `voice` (a name or `{"id": name}`; an OpenAI voice: the default)."""
    name = voice.get("id") if isinstance(voice, dict) else voice
    if isinstance(name, str) and name.lower() in OPENAI_VOICES:
        return spec.default_voice
    try:
        return spec.voice(name if isinstance(name, str) else "")
    except ValueError as e:
        raise ProtocolError("invalid_value", f"Invalid value for '{where}': {e}, or one of OpenAI's voices "
                            f"({', '.join(OPENAI_VOICES)}), which map to its default.", where) from None


def voice_options(voice: Any, spec: ModelSpec, voices: CustomVoices | None, where: str, load: bool = True) -> dict:
    """GenerationOptions' fields for a `voice`: a model voice or a custom voice's audio (`load` False: only checked)."""
    from .voices import is_custom

    if not is_custom(voice):
        return {"voice": model_voice(voice, spec, where)}
    if voices is None:
        raise ProtocolError("invalid_value", f"Invalid value for '{where}': custom voices are not available here.",
                            where)
    try:
        return voices.custom(voice["id"], where, load)
    except (ValueError, LookupError) as e:
        raise ProtocolError("invalid_value", str(e), where) from None


def check_config(cfg: dict, spec: ModelSpec, where: str = "session", voices: CustomVoices | None = None) -> dict:
    """`cfg` (a session's config, or a response's: the session's with its overrides) if the model can serve it."""
    if (cfg.get("type") == "transcription" or cfg["audio"]["input"].get("transcription")) and not spec.transcribes:
        raise ProtocolError("invalid_value", f"This model ({spec.name}) cannot transcribe audio: leave "
                            "'audio.input.transcription' null and use a realtime session.",
                            f"{where}.audio.input.transcription")
    if cfg.get("type") == "transcription":
        return cfg
    if "audio" in cfg["output_modalities"] and not spec.speaks:
        raise ProtocolError("invalid_value", f"This model ({spec.name}) replies in text only: set "
                            "output_modalities to ['text'].", f"{where}.output_modalities")
    if cfg["tools"] and not spec.tools:
        raise ProtocolError("invalid_value", f"This model ({spec.name}) cannot call tools: leave 'tools' empty.",
                            f"{where}.tools")
    voice_options(cfg["audio"]["output"]["voice"], spec, voices, f"{where}.audio.output.voice", load=False)
    return cfg
