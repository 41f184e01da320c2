"""The conversation.item.* client events of a RealtimeSession."""

from __future__ import annotations

import asyncio
import json

from .audio import AudioFormat
from .input_audio import encoded
from .items import Item, item_from_client
from .protocol import ProtocolError, clip, require

MAX_ITEM_CHARS = 4 * 1024 * 1024  # an item as the server echoes it (JSON, non-ASCII escaped): twice in the outbox


def _item_to_add(raw: dict, fmt: AudioFormat, rate: int) -> Item:
    """A conversation.item.create's item, refused when its echoes (item.added and item.done) would be huge."""
    item = item_from_client(raw, fmt, rate)
    if len(json.dumps(item.data)) > MAX_ITEM_CHARS:
        raise ProtocolError("item_too_large", f"Item is larger than {MAX_ITEM_CHARS >> 20} MiB as JSON: send its "
                            "text in smaller items (the model's context holds far less anyway).", "item")
    return item


class ItemEvents:
    """Mixed into RealtimeSession: creating, reading, deleting and truncating conversation items."""

    async def item_create(self, event: dict) -> None:
        raw = require(event, "item", dict)
        if len(self.conversation.items) >= self.limits.max_items:
            raise ProtocolError("conversation_full", f"The conversation holds {self.limits.max_items} items; "
                                "delete some first.")
        item = await self._off(_item_to_add, raw, self.input_format, self.pipeline.spec.input_rate)
        if any(i.id == item.id for i in self.conversation.items):
            raise ProtocolError("invalid_value", f"Item {clip(item.id)} already exists.", "item.id")
        prev = self.conversation.insert(item, event.get("previous_item_id"))
        self._echo(prev, item)

    def _echo(self, prev: str | None, item: Item) -> None:
        for kind in ("conversation.item.added", "conversation.item.done"):
            self.send({"type": kind, "previous_item_id": prev, "item": item.data})

    async def item_retrieve(self, event: dict) -> None:
        item = self.conversation.get(require(event, "item_id"))
        data = item.data
        if item.audio is not None and data.get("role") == "user":  # the user's audio, in the session's format
            audio = await self._off(encoded, item.audio, self.input_format, self.pipeline.spec.input_rate)
            data = {**data, "content": [{**p, "audio": audio} if p["type"] == "input_audio" else p
                                        for p in data["content"]]}
        self.send({"type": "conversation.item.retrieved", "item": data})

    async def item_delete(self, event: dict) -> None:
        item_id = require(event, "item_id")
        self.conversation.delete(item_id)
        self.send({"type": "conversation.item.deleted", "item_id": item_id})

    async def item_truncate(self, event: dict) -> None:
        item = self.conversation.get(require(event, "item_id"))
        index = require(event, "content_index", int)
        end_ms = require(event, "audio_end_ms", int)
        if item.data.get("role") != "assistant" or not item.data["content"] or \
                item.data["content"][0].get("type") != "output_audio":
            raise ProtocolError("invalid_value", "Only assistant messages with audio can be truncated.", "item_id")
        if index != 0:
            raise ProtocolError("invalid_value", f"Invalid content_index: {index}.", "content_index")
        if end_ms < 0 or end_ms > item.audio_ms:
            raise ProtocolError("invalid_value", f"audio_end_ms ({end_ms}) is past the end of the item's audio "
                                f"({item.audio_ms} ms).", "audio_end_ms")
        if self.response is not None and any(i is item for i in self.response.items):
            self._cancel("client_cancelled")
            await asyncio.shield(self.task)
        rolled_back = False
        if item.turn_id is not None:
            try:
                heard_ms = int(end_ms * item.speed)  # of the model's audio, before the time-scaling
                text, rolled_back = await asyncio.wrap_future(
                    self.pipeline.truncate_reply(self.pipe_session, item.turn_id, heard_ms))
                item.data["content"][0]["transcript"] = text
            except KeyError:
                pass
        if not rolled_back:  # the pipeline's cache still holds the whole reply: re-read at the next response
            self.sent_context = None
        item.audio_ms = end_ms
        self.send({"type": "conversation.item.truncated", "item_id": item.id, "content_index": 0,
                   "audio_end_ms": end_ms})
