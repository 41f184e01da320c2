"""The conversation as the client sees it (items in order) and as pipeline messages (items keep their user audio)."""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass, field

import torch

from pipelines.types import AudioAhead, Message, ToolCall

from .audio import AudioFormat, decode, to_model_rate
from .protocol import ProtocolError, clip, new_id


@dataclass
class Item:
    data: dict  # the protocol representation (id, type, role, content, status, ...)
    audio: torch.Tensor | None = None  # user audio, 16 kHz
    turn_id: str | None = None  # the pipeline turn that wrote an assistant item
    audio_ms: int = 0  # assistant audio sent so far
    speed: float = 1.0  # of that audio: the model's audio time is audio_ms * speed
    ahead: AudioAhead | None = None  # user audio encoded as it arrived, until a turn takes it

    @property
    def id(self) -> str:
        return self.data["id"]


@dataclass
class Conversation:
    items: list[Item] = field(default_factory=list)

    def get(self, item_id: str) -> Item:
        for item in self.items:
            if item.id == item_id:
                return item
        raise ProtocolError("item_not_found", f"Item with item_id not found: {clip(item_id)}", "item_id")

    def insert(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Append, or place right after `previous_item_id` ("root": first). Returns the previous id."""
        if previous_item_id is None:
            prev = self.items[-1].id if self.items else None
            self.items.append(item)
            return prev
        if previous_item_id == "root":
            self.items.insert(0, item)
            return None
        index = self.items.index(self.get(previous_item_id))
        self.items.insert(index + 1, item)
        return previous_item_id

    def delete(self, item_id: str) -> None:
        self.items.remove(self.get(item_id))


def user_audio_item(item_id: str, audio: torch.Tensor, ahead: AudioAhead | None = None) -> Item:
    data = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_audio", "transcript": None}]}
    return Item(data, audio=audio, ahead=ahead)


def item_from_client(raw: dict, input_format: AudioFormat, rate: int) -> Item:
    """A conversation.item.create payload, validated; its audio at the model's input `rate` (0: it hears no audio)."""
    if not isinstance(raw, dict):
        raise ProtocolError("invalid_type", "item must be an object", "item")
    kind = raw.get("type")
    item_id = raw.get("id") or new_id("item")
    if not isinstance(item_id, str) or len(item_id) > 64:
        raise ProtocolError("invalid_value", "item.id must be a string of at most 64 characters", "item.id")
    data = {"id": item_id, "object": "realtime.item", "type": kind, "status": "completed"}
    required = {"function_call_output": ("call_id", "output"), "function_call": ("name", "arguments")}
    for key in required.get(kind, ()) if isinstance(kind, str) else ():
        if not isinstance(raw.get(key), str):
            raise ProtocolError("missing_required_parameter", f"Missing required parameter: 'item.{key}'.",
                                f"item.{key}")
    if kind == "function_call_output":
        return Item({**data, "call_id": raw["call_id"], "output": raw["output"]})
    if kind == "function_call":
        if not isinstance(raw.get("call_id") or "", str):
            raise ProtocolError("invalid_type", "item.call_id must be a string", "item.call_id")
        return Item({**data, "name": raw["name"], "arguments": raw["arguments"],
                     "call_id": raw.get("call_id") or new_id("call")})
    if kind != "message":
        raise ProtocolError("invalid_value", f"Unsupported item type: {clip(kind)}", "item.type")
    role = raw.get("role")
    if role not in ("user", "assistant", "system"):
        raise ProtocolError("invalid_value", f"Invalid role: {clip(role)}", "item.role")
    content = raw.get("content")
    if not isinstance(content, list) or not content:
        raise ProtocolError("missing_required_parameter", "Missing required parameter: 'item.content'.", "item.content")
    parts, audio = [], []
    allowed = {"user": ("input_text", "input_audio"), "system": ("input_text",),
               "assistant": ("output_text", "text", "output_audio", "audio")}[role]
    for i, part in enumerate(content):
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype not in allowed:
            raise ProtocolError("invalid_value", f"Content type {clip(ptype)} is not allowed in a {role} message",
                                f"item.content[{i}].type")
        bad = [k for k, v in part.items() if k != "type" and not isinstance(v, str | None)]
        if bad:
            raise ProtocolError("invalid_type", f"item.content[{i}].{clip(bad[0])} must be a string",
                                f"item.content[{i}].{clip(bad[0])}")
        if ptype == "input_audio":
            if not rate:
                raise ProtocolError("invalid_value", "This model does not take audio input.", f"item.content[{i}].type")
            try:
                pcm = decode(base64.b64decode(part.get("audio") or "", validate=True), input_format)
            except (ValueError, TypeError) as e:
                raise ProtocolError("invalid_value", f"Invalid audio: {clip(str(e), 200)}",
                                    f"item.content[{i}].audio") from None
            audio.append(to_model_rate(pcm, input_format, rate))
            parts.append({"type": "input_audio", "transcript": part.get("transcript")})
        else:
            parts.append(copy.deepcopy(part))
    return Item({**data, "role": role, "content": parts}, audio=torch.cat(audio) if audio else None)


def item_text(item: Item) -> str:
    return "".join(part[key] for part in item.data.get("content", []) for key in ("text", "transcript")
                   if isinstance(part.get(key), str) and part["type"] != "input_audio")


def to_messages(items: list[Item]) -> list[Message]:
    """Pipeline messages for these items, in order (consecutive function calls share one message)."""
    out: list[Message] = []
    for item in items:
        d = item.data
        if d["type"] == "function_call_output":
            out.append(Message("tool", d["output"]))
        elif d["type"] == "function_call":
            call = ToolCall(d["name"], d["arguments"], d.get("call_id", ""))
            if out and out[-1].role == "assistant" and out[-1].tool_calls:
                out[-1] = Message("assistant", out[-1].text, tool_calls=(*out[-1].tool_calls, call))
            else:
                out.append(Message("assistant", "", tool_calls=(call,)))
        else:
            out.append(Message(d["role"], item_text(item), item.audio, ahead=item.ahead))
    return out
