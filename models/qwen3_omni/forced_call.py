"""tool_choice "required" or a named function: the reply is one tool call, whatever the model would have said.

Qwen has no native tool_choice, so a `CallWriter` keeps the thinker's sampled tokens inside the grammar of
    <tool_call>\\n{"name": "NAME", "arguments": {"KEY": VALUE, ...}}\\n</tool_call><|im_end|>
Where the grammar allows one token only, it is taken. Elsewhere the sampled token is kept when the grammar takes
it, else read as the model leaving that place: a function name while the tokens spell a tool's name's beginning
(else the first tool that fits); a string of tokens with no quote, backslash, control byte or special token; digits
(one "." in a number, "0" if none); "true" if the token's text begins with "t", else "false"; the enum value that
begins with the token's text, else the first; {}, [] or null for objects, arrays and null. Values are capped at
MAX_*_TOKENS and the arguments hold the schema's required properties (all when none are listed, at most
MAX_PROPERTIES) in its order, so the call stays short and always valid JSON."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from models.common.tokenizer import Tokenizer

from .tools import chosen_functions, qwen_tool

MAX_STRING_TOKENS = 8
MAX_NUMBER_TOKENS = 6
MAX_PROPERTIES = 8


@dataclass
class _Value:
    kind: str  # "string", "integer", "number", "boolean", "enum", "function"
    choices: tuple[str, ...] = ()  # enum values, or function names


def _schema_parts(parameters: Mapping[str, Any]) -> list[str | _Value]:
    """The arguments object as forced text and values, e.g. ['{"city": "', _Value("string"), '"}']."""
    props = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if not isinstance(props, Mapping) or not props:
        return ["{}"]
    required = parameters.get("required")
    names = [n for n in props if not isinstance(required, list) or not required or n in required][:MAX_PROPERTIES]
    parts: list[str | _Value] = []
    for i, name in enumerate(names):
        parts.append(("{" if i == 0 else ", ") + json.dumps(name) + ": ")
        schema = props[name] if isinstance(props[name], Mapping) else {}
        kind = schema.get("type")
        kind = next((k for k in kind if k != "null"), "string") if isinstance(kind, list) else kind
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            parts.append(_Value("enum", tuple(json.dumps(v) for v in schema["enum"])))
        elif kind in ("integer", "number", "boolean"):
            parts.append(_Value(kind))
        elif kind in ("object", "array", "null"):
            parts.append({"object": "{}", "array": "[]", "null": "null"}[kind])
        else:
            parts += ['"', _Value("string"), '"']
    parts.append("}")
    return parts


def call_parts(tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping) -> list[str | _Value]:
    """The whole reply as forced text and values; the function is fixed or chosen among the tools."""
    fns = chosen_functions(tools, tool_choice)
    if len(fns) == 1:
        return ['<tool_call>\n{"name": "', *_after_name(fns[0], fns[0]["name"])]
    return ['<tool_call>\n{"name": "', _Value("function", tuple(f["name"] for f in fns))]  # the rest: once chosen


def _after_name(fn: Mapping[str, Any], rest: str) -> list[str | _Value]:
    """The call after the name's first characters: the rest of the name, then the arguments."""
    return [rest + '", "arguments": ', *_schema_parts(fn.get("parameters") or {}), "}\n</tool_call><|im_end|>"]


@dataclass
class CallWriter:
    """Keeps one turn's reply a tool call: `choose(sampled)` returns the token to keep."""

    tokenizer: Tokenizer
    tools: Sequence[Mapping[str, Any]]
    parts: deque = field(default_factory=deque)
    forced: deque = field(default_factory=deque)  # token ids to take before anything else
    value: _Value | None = None
    taken: list[bytes] = field(default_factory=list)  # the current value's tokens so far

    @classmethod
    def for_choice(cls, tokenizer: Tokenizer, tools: Sequence[Mapping[str, Any]],
                   tool_choice: str | Mapping) -> CallWriter | None:
        if not tools or not (tool_choice == "required" or isinstance(tool_choice, Mapping)):
            return None
        return cls(tokenizer, tools, deque(call_parts(tools, tool_choice)))

    def choose(self, sampled: int) -> int:
        while not self.forced and self.value is None and self.parts:
            part = self.parts.popleft()
            if isinstance(part, str):
                self.forced.extend(self.tokenizer.encode(part))
            else:
                self.value, self.taken = part, []
        if self.forced:
            return self.forced.popleft()
        if self.value is None:  # the call is written: only the end of the turn remains
            return self.tokenizer.special_ids["<|im_end|>"]
        keep = self._take(sampled)
        if keep is not None:
            return keep
        self.value = None
        return self.choose(sampled)

    def _take(self, sampled: int) -> int | None:
        """`sampled` when the current value takes it; None once the value is complete (its rest is queued)."""
        v, data = self.value, self.tokenizer.token_bytes(sampled)
        text = data.decode("utf-8", errors="replace")
        special = sampled in self.tokenizer.special_ids.values()
        if v.kind == "string":
            if not special and data and len(self.taken) < MAX_STRING_TOKENS and \
                    not any(b in b'"\\' or b < 0x20 for b in data):
                self.taken.append(data)
                return sampled
            return None
        if v.kind in ("integer", "number"):
            so_far = b"".join(self.taken).decode()
            allowed = "0123456789" + ("." if v.kind == "number" and "." not in so_far and so_far else "")
            if not special and text and all(c in allowed for c in text) and len(self.taken) < MAX_NUMBER_TOKENS \
                    and not (so_far == "0" and text[0].isdigit()):
                self.taken.append(data)
                return sampled
            if not so_far or so_far.endswith("."):
                self.parts.appendleft("0")
            return None
        stripped = text.strip().strip('"').lower()
        if v.kind == "boolean":
            self.parts.appendleft("true" if stripped.startswith("t") else "false")
            return None
        if v.kind == "enum":
            pick = next((c for c in v.choices if stripped and c.strip('"').lower().startswith(stripped)), v.choices[0])
            self.parts.appendleft(pick)
            return None
        return self._name(sampled, text, special)

    def _name(self, sampled: int, text: str, special: bool) -> int | None:
        so_far = b"".join(self.taken).decode("utf-8", errors="replace")
        fits = [c for c in self.value.choices if text and not special and c.startswith(so_far + text)]
        if fits:
            self.taken.append(text.encode())
            so_far += text
        if len(fits) > 1:
            return sampled
        pick = fits[0] if fits else so_far if so_far in self.value.choices else \
            next(c for c in self.value.choices if c.startswith(so_far))
        fn = next(qwen_tool(t)["function"] for t in self.tools if qwen_tool(t)["function"]["name"] == pick)
        self.parts.extendleft(reversed(_after_name(fn, pick[len(so_far):])))
        self.value = None
        return sampled if fits else None


def forcing(writer: CallWriter, embed: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """(sampled token, its embedding [1, D]) -> (kept token, its embedding): the thinker reads what was kept."""

    def keep(token: int, embedding: torch.Tensor) -> tuple[int, torch.Tensor]:
        chosen = writer.choose(token)
        if chosen == token:
            return token, embedding
        return chosen, embed(torch.tensor([chosen], device=embedding.device))

    return keep
