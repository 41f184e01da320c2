"""Qwen's function-calling format, byte for byte what Qwen3's chat template renders (Qwen3-VL's tool parts;
assumed identical for Qwen3-Omni, whose template is unavailable offline). The four tags are single special tokens.
- system turn: the instructions, "\\n\\n", then the "# Tools" block, one `tojson` line per tool (json.dumps,
  default separators, ensure_ascii=False, keys in given order); the block alone without instructions (unlike
  Qwen2.5, which puts its default "You are Qwen..." first); so changing tools or tool_choice changes the cached prefix.
- assistant turn: its text, then each call as `<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>`,
  joined by "\\n"; consecutive tool results: ONE user turn of `<tool_response>\\nOUTPUT\\n</tool_response>`s
  joined by "\\n"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from models.common.chat import Turn
from pipelines.types import ToolCall

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_START, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
                '<args-json-object>}\n</tool_call>')
# Our own wording (Qwen was not trained on a tool_choice signal): added to the instructions, before the block.
REQUIRED_INSTRUCTION = "In this reply, you must call at least one of the functions below."
FORCED_INSTRUCTION = 'In this reply, you must call the function "{name}".'
Tools = Sequence[Mapping[str, Any]]  # Realtime function tools, or the Chat Completions form
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(?:" + re.escape(TOOL_CALL_END) + r"|\Z)", re.DOTALL)


def qwen_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A Realtime function tool in the Chat Completions form Qwen's template prints ({"type": "function",
    "function": {"name", "description", "parameters"}}); one already in that form passes through."""
    if tool.get("type") != "function":
        raise ValueError(f"only function tools are supported, got type {tool.get('type')!r}")
    fields = tool["function"] if isinstance(tool.get("function"), Mapping) else tool
    if not isinstance(fields.get("name"), str) or not fields["name"]:
        raise ValueError(f"a function tool needs a non-empty name, got {tool!r}")
    if fields is tool:
        fields = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": dict(fields)}


def chosen_functions(tools: Tools, tool_choice: str | Mapping) -> list[dict[str, Any]]:
    """The Qwen-form functions a tool_choice offers: all of them, or the one it names (ValueError if absent)."""
    fns = [qwen_tool(t)["function"] for t in tools]
    if isinstance(tool_choice, Mapping):
        name = tool_choice.get("name") or (tool_choice.get("function") or {}).get("name")
        fns = [f for f in fns if f["name"] == name]
        if not fns:
            raise ValueError(f"tool_choice names function {name!r}, which is not among the tools")
    return fns


def render_tools_system(system_text: str, tools: Tools) -> str:
    """The system turn's text (between "system\\n" and <|im_end|>) offering `tools` (Realtime or Qwen form).
    Empty `system_text` counts as no system message; no tools leaves `system_text` as it is."""
    if not tools:
        return system_text
    lines = "".join("\n" + json.dumps(qwen_tool(t), ensure_ascii=False) for t in tools)
    block = TOOLS_HEADER + lines + TOOLS_FOOTER
    return f"{system_text}\n\n{block}" if system_text else block


def tools_system(system_text: str, tools: Tools, tool_choice: str | Mapping = "auto") -> str:
    """The system turn's text for `tools` + `tool_choice`. "auto" is Qwen's only native mode; "none" omits the
    block; "required" and {"type": "function", "name": N} (only N offered) add our instruction to the system
    text, so the turn is still one the template produces, and forced_call.CallWriter keeps the reply one call."""
    if tool_choice == "none":
        return system_text
    if tool_choice == "auto":
        return render_tools_system(system_text, tools)
    if tool_choice == "required":
        if not tools:
            raise ValueError('tool_choice "required" needs at least one tool')
        instruction = REQUIRED_INSTRUCTION
    elif isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        tools = [{"type": "function", "function": f} for f in chosen_functions(tools, tool_choice)]
        instruction = FORCED_INSTRUCTION.format(name=tools[0]["function"]["name"])
    else:
        raise ValueError(f"tool_choice must be auto, none, required or a function, got {tool_choice!r}")
    return render_tools_system(f"{system_text}\n\n{instruction}" if system_text else instruction, tools)


def tool_call_text(name: str, arguments_json: str) -> str:
    """One call as the template renders it. JSON arguments are re-printed as tojson prints them (", " and ": "),
    as the model writes them; text that is not JSON goes in verbatim."""
    try:
        arguments = json.dumps(json.loads(arguments_json), ensure_ascii=False)
    except json.JSONDecodeError:
        arguments = arguments_json
    return f'{TOOL_CALL_START}\n{{"name": "{name}", "arguments": {arguments}}}\n{TOOL_CALL_END}'


def assistant_text(text: str, calls: Iterable[ToolCall]) -> str:
    """An assistant turn's content: its text, then its tool calls, each on a new line."""
    parts = [text] if text else []
    parts += [tool_call_text(c.name, c.arguments) for c in calls]
    return "\n".join(parts)


def tool_response_text(output: str) -> str:
    """One function result, as it appears in the user turn that carries it."""
    return f"{TOOL_RESPONSE_START}\n{output}\n{TOOL_RESPONSE_END}"


def _parse_block(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        arguments = obj.get("arguments", {})
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False, separators=(",", ":")))


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """The <tool_call> blocks of model output, in order: the valid calls (arguments as compact JSON, {} if
    missing), and the invalid blocks' stripped text (not JSON, no non-empty string "name", or "arguments" not
    an object or a string holding one). Never raises; a block left open at the end is read as closed."""
    parsed = [(body, _parse_block(body)) for body in (m.group(1).strip() for m in _BLOCK.finditer(text))]
    return [call for _, call in parsed if call is not None], [body for body, call in parsed if call is None]


def with_tools(turns: list[Turn], tools: Tools, tool_choice: str | Mapping = "auto") -> list[Turn]:
    """A session's first turns with the tools offered in its system turn (one is added when there is none)."""
    has_system = bool(turns) and turns[0].role == "system"
    system = tools_system(turns[0].text if has_system else "", tools, tool_choice)
    if not system and not has_system:
        return list(turns)
    return [Turn("system", system), *turns[int(has_system) :]]


def _is_tool_result(turn: Turn) -> bool:
    return turn.role == "user" and not turn.audio_tokens and turn.text.startswith(TOOL_RESPONSE_START) \
        and turn.text.endswith(TOOL_RESPONSE_END)


def merge_tool_results(turns: Iterable[Turn]) -> list[Turn]:
    """Consecutive tool-result user turns (tool_response_text each) joined into one, as the template does."""
    out: list[Turn] = []
    for turn in turns:
        if out and _is_tool_result(turn) and _is_tool_result(out[-1]):
            out[-1] = Turn("user", f"{out[-1].text}\n{turn.text}")
        else:
            out.append(turn)
    return out
