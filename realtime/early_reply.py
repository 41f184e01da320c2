"""A reply started in the silence (README "Turn detection"): at EndLikely the session starts the turn the commit
would start, held back in the pipeline; the commit releases it, anything that changes what it was made from
discards it (the pipeline rolls the session back; none of its events reach the client)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pipelines.types import Event, Message, Turn

from .items import Item, to_messages, user_audio_item
from .protocol import new_id


@dataclass
class Plan:
    """The pipeline session and messages a response over `ids` would send, and what it changes."""

    session: str
    messages: list[Message]
    ids: list[str]
    context: tuple
    reuse: bool  # False: the conversation is prefilled afresh in a new pipeline session


@dataclass
class HeldReply:
    turn: Turn
    events: AsyncIterator[Event]
    item: Item  # the user audio item its commit adds
    chunks: int  # input buffer chunks it was made from
    cfg: dict  # the response config it was made with
    plan: Plan


class EarlyReply:
    """Mixed into RealtimeSession: holding, releasing and discarding the reply started in the silence."""

    held: HeldReply | None = None

    def _plan(self, cfg: dict, items: list[Item]) -> Plan:
        context = (cfg["instructions"], json.dumps(cfg["tools"]), json.dumps(cfg["tool_choice"]))
        system = [Message("system", cfg["instructions"])] if cfg["instructions"] else []
        ids = [i.id for i in items]
        reuse = context == self.sent_context and ids[: len(self.sent)] == self.sent
        messages = to_messages(items[len(self.sent):]) if reuse else system + to_messages(items)
        return Plan(self.pipe_session if reuse else new_id("pipe"), messages, ids, context, reuse)

    def _adopt(self, plan: Plan) -> None:
        for item in self.conversation.items:  # their turn has taken what was encoded ahead
            item.ahead = None
        if not plan.reuse:
            self.pipeline.end_session(self.pipe_session)
            self.pipe_session = plan.session
        self.sent, self.sent_context = plan.ids, plan.context

    async def _hold_reply(self) -> None:
        """Start the turn the commit of the current buffer would start, held back (when one would start)."""
        td = self.config["audio"]["input"]["turn_detection"]
        if self.held is not None or self.transcribing or not td or not td.get("create_response", True) \
                or self.response is not None or self.respond_after or self.speech_item is None \
                or self.buffer_ms < self.min_commit_ms:
            return
        chunks, item_id = len(self.buffer), self.speech_item
        audio, ahead = await self._buffer_audio(last=False)
        if len(self.buffer) != chunks or self.speech_item != item_id or self.response is not None \
                or self.held is not None:
            return  # the buffer or the turn moved on while it was resampled
        item = user_audio_item(item_id, audio, ahead)
        cfg = self._response_config({})
        plan = self._plan(cfg, self._context() + [item])
        turn = Turn(plan.session, plan.messages, self._turn_options(cfg))
        self.held = HeldReply(turn, self.pipeline.submit(turn, held=True), item, chunks, cfg, plan)

    def _held_item(self, item_id: str) -> Item | None:
        """The held turn's item, if the commit of `item_id` is the one it was made for (audio appended since
        EndLikely is the pause the VAD waited out: speech would have withdrawn it)."""
        h = self.held
        if h is not None and h.item.id == item_id and h.chunks <= len(self.buffer):
            return h.item
        self._discard_held()
        return None

    def _take_held(self, spec: dict, inputs: list[Item] | None) -> HeldReply | None:
        """The held turn, if the response about to start is the one it was made for; else it goes."""
        h, self.held = self.held, None
        if h is None:
            return None
        if spec or inputs is not None or self._response_config({}) != h.cfg \
                or [i.id for i in self._context()] != h.plan.ids:
            self.held = h
            self._discard_held()
            return None
        self._adopt(h.plan)
        return h

    def _discard_held(self) -> None:
        h, self.held = self.held, None
        if h is not None:
            self.pipeline.discard(h.turn.turn_id)  # queued before any later turn of the session starts
