"""Realtime GA protocol pieces: ids, errors, event parsing, the session config (defaults, validated deep-merges)."""

from __future__ import annotations

import copy
import itertools
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipelines.spec import ModelSpec

from .audio import AudioFormat
from .vad import SEMANTIC_VAD_DEFAULTS, SERVER_VAD_DEFAULTS, VadConfig

_counter = itertools.count(1)


def new_id(prefix: str) -> str:
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


SERVER_ERROR = ProtocolError("server_error", "The server had an error while processing your request.",
                             type="server_error")

MAX_EVENT_CHARS = 24 * 1024 * 1024  # a 15 MiB append in base64, plus room
MAX_DEPTH = 32  # JSON nesting; the deepest real event (a tool schema) needs far less
MAX_ECHO = 128  # characters of a client string (event_id, type, id) echoed back in errors
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # an escaped UTF-16 surrogate: paired, or a lone one
_STEP = np.zeros(256, np.int8)
_STEP[[ord("["), ord("{")]], _STEP[[ord("]"), ord("}")]] = 1, -1


def clip(value: Any, n: int = MAX_ECHO) -> str:
    text = value if isinstance(value, str) else repr(value)[: n + 1]
    return text if len(text) <= n else text[:n] + "..."


def _depth(raw: str) -> int:
    """Deepest bracket nesting outside strings, found without parsing (vectorised, in 1 MiB chunks)."""
    if raw.count("[") + raw.count("{") <= MAX_DEPTH:
        return 0
    data = np.frombuffer(raw.replace("\\\\", "").replace('\\"', "").encode(), np.uint8)
    deepest = depth = quotes = 0
    for i in range(0, len(data), 1 << 20):
        chunk = data[i : i + (1 << 20)]
        inside = np.cumsum(chunk == ord('"'), dtype=np.int32) + quotes
        levels = np.cumsum(np.where(inside % 2 == 0, _STEP[chunk], 0), dtype=np.int32) + depth
        deepest, depth, quotes = max(deepest, int(levels.max())), int(levels[-1]), int(inside[-1])
    return deepest


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


_JSON = json.JSONDecoder(parse_constant=_no_constant)  # json.loads with an argument builds one a call


def parse_event(raw: str | bytes) -> dict:
    """One client frame -> an event object; size and depth are checked before parsing."""
    if isinstance(raw, bytes):
        raise ProtocolError("invalid_event", "Binary frames are not supported; send JSON text events.")
    if len(raw) > MAX_EVENT_CHARS:
        raise ProtocolError("invalid_event", f"Event is larger than {MAX_EVENT_CHARS} characters.")
    if _depth(raw) > MAX_DEPTH:
        raise ProtocolError("invalid_json", f"Invalid JSON: nested deeper than {MAX_DEPTH} levels.")
    try:
        event = _JSON.decode(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, over-long integer literals, NaN
        raise ProtocolError("invalid_json", f"Invalid JSON: {clip(str(e), 200)}") from None
    if not isinstance(event, dict):
        raise ProtocolError("invalid_event", "An event must be a JSON object.")
    if _SURROGATE.search(raw) and _lone_surrogate(event):
        raise ProtocolError("invalid_value", "Strings must be valid Unicode: the event holds an unpaired surrogate "
                            "escape (\\udXXX).")
    return event


def _lone_surrogate(node: Any) -> bool:
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack += [*x.keys(), *x.values()]
        elif isinstance(x, list):
            stack += x
        elif isinstance(x, str) and not x.isascii():
            try:
                x.encode()
            except UnicodeEncodeError:
                return True
    return False


def client_event_id(event: dict) -> str | None:
    value = event.get("event_id")
    return clip(value) if isinstance(value, str) else None


def default_session(model: str, spec: ModelSpec, session_id: str | None = None) -> dict:
    return {
        "type": "realtime", "object": "realtime.session", "id": session_id or new_id("sess"), "model": model,
        "output_modalities": ["audio" if spec.speaks else "text"], "instructions": "",
        "audio": {
            "input": {"format": AudioFormat().to_config(), "transcription": None,
                      "noise_reduction": None, "turn_detection": dict(SERVER_VAD_DEFAULTS)},
            "output": {"format": AudioFormat().to_config(), "voice": spec.default_voice or None, "speed": 1.0},
        },
        "tools": [], "tool_choice": "auto", "max_output_tokens": "inf", "tracing": None, "truncation": "auto",
        "prompt": None, "include": None, "parallel_tool_calls": True, "reasoning": None,
    }


# The shape of what a client may set (SCHEMA): nested dicts are sections, anything else is a leaf validator.
def _rule(message: str, ok: Callable[[Any], bool]) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not ok(v):
            raise ValueError(message)
    return check


EFFORTS = ("minimal", "low", "medium", "high", "xhigh")
_modalities = _rule("must be ['audio'] or ['text']", lambda v: v in (["audio"], ["text"]))
_str = _rule("must be a string", lambda v: isinstance(v, str))
_bool = _rule("must be true or false", lambda v: isinstance(v, bool))
_session_type = _rule("must be 'realtime' or 'transcription'", lambda v: v in ("realtime", "transcription"))
_reasoning = _rule(f"must be null or {{'effort': one of {list(EFFORTS)}}}", lambda v: v is None or (
    isinstance(v, dict) and set(v) <= {"effort"} and v.get("effort") in (None, *EFFORTS)))
_string_map = _rule("must be null or an object of at most 16 string values", lambda v: v is None or (
    isinstance(v, dict) and len(v) <= 16 and all(isinstance(x, str) and len(x) <= 512 for x in v.values())))
_max_tokens = _rule("must be an integer in 1..4096 or 'inf'", lambda v: v == "inf" or (
    not isinstance(v, bool) and isinstance(v, int) and 1 <= v <= 4096))
_tool_choice = _rule("must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}", lambda v: v in (
    "auto", "none", "required") or (isinstance(v, dict) and v.get("type") == "function"
                                    and isinstance(v.get("name"), str) and set(v) == {"type", "name"}))
_voice = _rule("must be a voice name or {'id': ...}", lambda v: (isinstance(v, str) and 0 < len(v) <= 64) or (
    isinstance(v, dict) and set(v) == {"id"} and isinstance(v["id"], str)))
_speed = _rule("must be a number in [0.25, 1.5]", lambda v: not isinstance(v, bool) and isinstance(v, int | float)
               and 0.25 <= v <= 1.5)
_include = _rule("must be null or ['item.input_audio_transcription.logprobs']", lambda v: v is None or (
    isinstance(v, list) and all(x == "item.input_audio_transcription.logprobs" for x in v)))
_number01 = lambda v: not isinstance(v, bool) and isinstance(v, int | float) and 0 <= v <= 1  # noqa: E731
_strings = lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v))  # noqa: E731


def _object(v: Any, fields: dict[str, Callable[[Any], bool]], required: tuple[str, ...] = ()) -> bool:
    """`v` is an object of some of `fields` (all of `required`), each passing its test."""
    return isinstance(v, dict) and set(v) <= set(fields) and set(required) <= set(v) and all(
        ok(v[k]) for k, ok in fields.items() if k in v)


_str_or_none = lambda v: isinstance(v, str | None)  # noqa: E731
_prompt = _rule("must be null or {'id': ..., 'version': ..., 'variables': {...}}", lambda v: v is None or _object(
    v, {"id": lambda x: isinstance(x, str), "version": _str_or_none, "variables": lambda x: isinstance(x, dict | None)},
    ("id",)))
_noise_reduction = _rule("must be null or {'type': 'near_field' | 'far_field', 'strength': 0..1}", lambda v: v is None
                         or _object(v, {"type": lambda x: x in ("near_field", "far_field"), "strength": _number01}))
_transcription = _rule("must be null or {'model': ..., 'language': ..., 'prompt': ..., 'keywords': [...], "
                       "'languages': [...], 'delay': ...}", lambda v: v is None or _object(v, {
                           "model": _str_or_none, "language": _str_or_none, "prompt": _str_or_none,
                           "keywords": _strings, "languages": _strings, "delay": lambda x: x in (None, *EFFORTS)}))
_tool = _rule("each tool must be {'type': 'function', 'name': ..., 'description': ..., 'parameters': {...}}",
              lambda t: _object(t, {"type": lambda x: x == "function", "name": lambda x: isinstance(x, str) and x,
                                    "description": lambda x: isinstance(x, str),
                                    "parameters": lambda x: isinstance(x, dict)}, ("type", "name")))
_truncation = _rule("must be 'auto', 'disabled' or {'type': 'retention_ratio', 'retention_ratio': 0..1}",
                    lambda v: v in ("auto", "disabled") or _object(v, {
                        "type": lambda x: x == "retention_ratio", "retention_ratio": _number01,
                        "token_limits": lambda x: x is None or _object(x, {"post_instructions": lambda n: isinstance(
                            n, int)})}, ("type", "retention_ratio")))


def _format(v: Any) -> None:
    if not isinstance(v, dict):
        raise ValueError("must be an object like {'type': 'audio/pcm', 'rate': 24000}")
    AudioFormat.from_config(v)


def _turn_detection(v: Any) -> None:
    if v is None:
        return
    if not isinstance(v, dict) or v.get("type") not in ("server_vad", "semantic_vad"):
        raise ValueError("type must be 'server_vad' or 'semantic_vad' (or turn_detection null)")
    allowed = SERVER_VAD_DEFAULTS if v["type"] == "server_vad" else SEMANTIC_VAD_DEFAULTS
    unknown = set(v) - set(allowed)
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}")
    VadConfig.from_config({**allowed, **v})  # the detector's own rules, before anything is applied


def _tools(v: Any) -> None:
    if not isinstance(v, list) or len(v) > 128:
        raise ValueError("must be a list of at most 128 tools")
    for t in v:
        _tool(t)


def _tracing(v: Any) -> None:
    if v in (None, "auto"):
        return
    if not _object(v, {"workflow_name": _str_or_none, "group_id": _str_or_none, "metadata": lambda x: True}):
        raise ValueError("must be null, 'auto' or {'workflow_name': ..., 'group_id': ..., 'metadata': {...}}")
    _string_map(v.get("metadata"))


SCHEMA: dict = {
    "type": _session_type, "reasoning": _reasoning,
    "model": _str, "instructions": _str, "output_modalities": _modalities, "tools": _tools,
    "tool_choice": _tool_choice, "max_output_tokens": _max_tokens, "tracing": _tracing, "truncation": _truncation,
    "prompt": _prompt, "include": _include, "parallel_tool_calls": _bool,
    "audio": {
        "input": {"format": _format, "transcription": _transcription,
                  "noise_reduction": _noise_reduction, "turn_detection": _turn_detection},
        "output": {"format": _format, "voice": _voice, "speed": _speed},
    },
}
TRANSCRIPTION_SCHEMA: dict = {"type": _session_type, "include": _include, "audio": {"input": SCHEMA["audio"]["input"]}}


def update_session(current: dict, update: Any, model: str, spec: ModelSpec) -> dict:
    """A `session.update` applied (all validated first): a new `type` starts from its defaults, keeping id and input."""
    if not isinstance(update, dict):
        raise ProtocolError("invalid_type", "session must be an object", "session")
    kind = update.get("type", current["type"])
    _leaf(_session_type, kind, "session.type")
    base = current
    if kind != current["type"]:
        audio_input = {k: v for k, v in current["audio"]["input"].items() if k != "transcription"}
        if kind == "transcription":  # GA's transcription session: audio in, transcripts out, never a response
            base = {"type": "transcription", "object": "realtime.transcription_session", "id": current["id"],
                    "audio": {"input": {**copy.deepcopy(audio_input), "transcription": {"model": None}}},
                    "include": None}
        else:
            base = default_session(model, spec, current["id"])
            base["audio"]["input"].update(copy.deepcopy(audio_input))
    return merge_update(base, update, SCHEMA if kind == "realtime" else TRANSCRIPTION_SCHEMA)


def _leaf(rule: Any, value: Any, where: str) -> None:
    try:
        rule(value)
    except ValueError as e:
        raise ProtocolError("invalid_value", f"Invalid value for '{where}': {clip(str(e), 300)}.", where) from None


def merge_update(current: dict, update: Any, schema: dict = SCHEMA, path: str = "session") -> dict:
    """`update` deep-merged into a copy of `current`; ProtocolError on an unknown key or an invalid value."""
    if not isinstance(update, dict):
        raise ProtocolError("invalid_type", f"{path} must be an object", path)
    out = copy.deepcopy(current)
    for key, value in update.items():
        where = f"{path}.{key}"
        if key not in schema:
            where = clip(where)
            raise ProtocolError("unknown_parameter", f"Unknown parameter: '{where}'.", where)
        rule = schema[key]
        if isinstance(rule, dict):
            out[key] = merge_update(out.get(key) or {}, value, rule, where)
            continue
        _leaf(rule, value, where)
        if key == "turn_detection" and value is not None:
            defaults = SERVER_VAD_DEFAULTS if value["type"] == "server_vad" else SEMANTIC_VAD_DEFAULTS
            prev = out.get(key) if (out.get(key) or {}).get("type") == value["type"] else {}
            value = {**defaults, **(prev or {}), **value}
        out[key] = copy.deepcopy(value)
    return out


def check_metadata(value: Any, where: str) -> None:
    _leaf(_string_map, value, where)


def require(event: dict, key: str, kind: type | tuple[type, ...] = str) -> Any:
    if key not in event or event[key] is None:
        raise ProtocolError("missing_required_parameter", f"Missing required parameter: '{key}'.", key)
    if not isinstance(event[key], kind) or (isinstance(event[key], bool) and kind is int):
        raise ProtocolError("invalid_type", f"Invalid type for '{key}'.", key)
    return event[key]
