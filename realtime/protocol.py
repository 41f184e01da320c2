"""OpenAI Realtime GA protocol pieces: ids, errors, and the session configuration (defaults, partial
deep-merge updates validated as a whole)."""

from __future__ import annotations

import copy
import itertools
import secrets
from dataclasses import dataclass
from typing import Any

from .audio import AudioFormat

_counter = itertools.count(1)


def new_id(prefix: str) -> str:
    """Unique, prefixed ids: event_, item_, resp_, sess_, call_."""
    return f"{prefix}_{secrets.token_hex(6)}{next(_counter):05d}"


@dataclass
class ProtocolError(Exception):
    """An error event for the client; the session stays open."""

    code: str
    message: str
    param: str | None = None
    type: str = "invalid_request_error"

    def event(self, client_event_id: str | None) -> dict:
        error = {"type": self.type, "code": self.code, "message": self.message, "param": self.param,
                 "event_id": client_event_id}
        return {"type": "error", "error": error}


SPEAKERS = ("ethan", "chelsie", "aiden")
DEFAULT_VOICE = "ethan"

SERVER_VAD_DEFAULTS = {
    "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
    "idle_timeout_ms": None, "create_response": True, "interrupt_response": True,
}
SEMANTIC_VAD_DEFAULTS = {"type": "semantic_vad", "eagerness": "auto", "create_response": True,
                         "interrupt_response": True}


def default_session(model: str) -> dict:
    return {
        "type": "realtime", "object": "realtime.session", "id": new_id("sess"), "model": model,
        "output_modalities": ["audio"], "instructions": "",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 24000}, "transcription": None,
                      "noise_reduction": None, "turn_detection": dict(SERVER_VAD_DEFAULTS)},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": DEFAULT_VOICE, "speed": 1.0},
        },
        "tools": [], "tool_choice": "auto", "max_output_tokens": "inf", "tracing": None, "truncation": "auto",
        "prompt": None, "include": None, "parallel_tool_calls": True,
    }


# The shape of what a client may set: nested dicts are sections, anything else is a leaf validator.
def _modalities(v: Any) -> None:
    if not isinstance(v, list) or not v or any(m not in ("text", "audio") for m in v) or len(v) > 1:
        raise ValueError("must be ['audio'] or ['text']")


def _format(v: Any) -> None:
    AudioFormat.from_config(v)


def _str(v: Any) -> None:
    if not isinstance(v, str):
        raise ValueError("must be a string")


def _max_tokens(v: Any) -> None:
    if v != "inf" and not (isinstance(v, int) and 1 <= v <= 4096):
        raise ValueError("must be an integer in 1..4096 or 'inf'")


def _turn_detection(v: Any) -> None:
    if v is None:
        return
    if not isinstance(v, dict) or v.get("type") not in ("server_vad", "semantic_vad"):
        raise ValueError("type must be 'server_vad' or 'semantic_vad' (or turn_detection null)")
    allowed = SERVER_VAD_DEFAULTS if v["type"] == "server_vad" else SEMANTIC_VAD_DEFAULTS
    unknown = set(v) - set(allowed)
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}")
    if "threshold" in v and not (isinstance(v["threshold"], int | float) and 0 <= v["threshold"] <= 1):
        raise ValueError("threshold must be in [0, 1]")
    for key in ("prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"):
        if v.get(key) is not None and not (isinstance(v[key], int) and 0 <= v[key] <= 600_000):
            raise ValueError(f"{key} must be a non-negative integer (ms)")
    if v.get("eagerness", "auto") not in ("low", "medium", "high", "auto"):
        raise ValueError("eagerness must be low, medium, high or auto")


def _tools(v: Any) -> None:
    if not isinstance(v, list):
        raise ValueError("must be a list")
    for t in v:
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise ValueError("each tool must be {'type': 'function', 'name': ..., 'parameters': {...}}")


def _tool_choice(v: Any) -> None:
    if v in ("auto", "none", "required"):
        return
    if not (isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("name"), str)):
        raise ValueError("must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}")


def _any(v: Any) -> None:
    return None


def _session_type(v: Any) -> None:
    if v != "realtime":
        raise ValueError("only 'realtime' sessions are served")


SCHEMA: dict = {
    "type": _session_type,
    "model": _str, "instructions": _str, "output_modalities": _modalities, "tools": _tools,
    "tool_choice": _tool_choice, "max_output_tokens": _max_tokens, "tracing": _any, "truncation": _any,
    "prompt": _any, "include": _any, "parallel_tool_calls": _any,
    "audio": {
        "input": {"format": _format, "transcription": _any, "noise_reduction": _any,
                  "turn_detection": _turn_detection},
        "output": {"format": _format, "voice": _any, "speed": _any},
    },
}


def merge_update(current: dict, update: Any, schema: dict = SCHEMA, path: str = "session") -> dict:
    """A new config: `update` deep-merged into `current`. Raises ProtocolError (nothing applied) on an
    unknown key or an invalid value."""
    if not isinstance(update, dict):
        raise ProtocolError("invalid_type", f"{path} must be an object", path)
    out = copy.deepcopy(current)
    for key, value in update.items():
        where = f"{path}.{key}"
        if key not in schema:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: '{where}'.", where)
        rule = schema[key]
        if isinstance(rule, dict):
            out[key] = merge_update(out.get(key) or {}, value, rule, where)
            continue
        try:
            rule(value)
        except ValueError as e:
            raise ProtocolError("invalid_value", f"Invalid value for '{where}': {e}.", where) from None
        if key == "turn_detection" and value is not None:
            defaults = SERVER_VAD_DEFAULTS if value["type"] == "server_vad" else SEMANTIC_VAD_DEFAULTS
            prev = out.get(key) if (out.get(key) or {}).get("type") == value["type"] else {}
            value = {**defaults, **(prev or {}), **value}
        out[key] = copy.deepcopy(value)
    return out


def speaker_for(voice: Any) -> str:
    """Our speakers by name; any other voice (OpenAI's alloy, marin, ...) maps to the default."""
    name = voice.get("id") if isinstance(voice, dict) else voice
    return name.lower() if isinstance(name, str) and name.lower() in SPEAKERS else DEFAULT_VOICE


def require(event: dict, key: str, kind: type | tuple[type, ...] = str) -> Any:
    if key not in event or event[key] is None:
        raise ProtocolError("missing_required_parameter", f"Missing required parameter: '{key}'.", key)
    if not isinstance(event[key], kind):
        raise ProtocolError("invalid_type", f"Invalid type for '{key}'.", key)
    return event[key]
