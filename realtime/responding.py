"""Starting, running and cancelling the responses of a RealtimeSession."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from pipelines.types import Event, GenerationOptions, Message, Turn, TurnError

from . import logs
from .audio import AudioFormat
from .capabilities import check_config, voice_options
from .items import Item, item_from_client, to_messages
from .protocol import SERVER_ERROR, ProtocolError, check_metadata, clip, merge_update, new_id
from .response import Response

log = logging.getLogger(__name__)


class Responding:
    """Mixed into RealtimeSession: the response.* client events and the responses they start."""

    async def response_create(self, event: dict) -> None:
        if self.transcribing:
            raise ProtocolError("invalid_value", "A transcription session does not create responses.", "session.type")
        if self.response is not None:
            raise ProtocolError("conversation_already_has_active_response",
                                f"Conversation already has an active response in progress: {self.response.id}. "
                                "Wait until the response is finished before creating a new one.")
        spec = {} if event.get("response") is None else event["response"]
        if not isinstance(spec, dict):
            raise ProtocolError("invalid_type", "'response' must be an object", "response")
        self._response_config(spec)  # every check before any work
        inputs = spec.get("input")
        if inputs is not None:
            if not isinstance(inputs, list) or len(inputs) > self.limits.max_items:
                raise ProtocolError("invalid_type", "'response.input' must be a list of items", "response.input")
            fmt, rate = self.input_format, self.pipeline.spec.input_rate
            inputs = await self._off(lambda: [item_from_client(raw, fmt, rate) for raw in inputs])
            if self.response is not None:  # a turn-detected response started meanwhile
                raise ProtocolError("conversation_already_has_active_response",
                                    f"Conversation already has an active response in progress: {self.response.id}.")
        self._start_response(spec, inputs)

    async def response_cancel(self, event: dict) -> None:
        wanted = event.get("response_id")
        if wanted is not None and not isinstance(wanted, str):
            raise ProtocolError("invalid_type", "'response_id' must be a string", "response_id")
        if self.response is None or wanted not in (None, self.response.id):
            raise ProtocolError("response_cancel_not_active", "Cancellation failed: no active response found"
                                + (f" with id {clip(wanted)}." if wanted else "."), "response_id" if wanted else None)
        self._cancel("client_cancelled")

    def _response_config(self, spec: dict) -> dict:
        """The session config with a response.create's overrides, every field checked."""
        allowed = {"conversation", "metadata", "input", "instructions", "output_modalities", "tools",
                   "tool_choice", "max_output_tokens", "audio", "prompt", "tracing", "reasoning", "parallel_tool_calls"}
        unknown = sorted(clip(k) for k in set(spec) - allowed)
        if unknown:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: 'response.{unknown[0]}'.",
                                f"response.{unknown[0]}")
        overrides = {k: v for k, v in spec.items() if k not in ("conversation", "metadata", "input")}
        cfg = check_config(merge_update(self.config, overrides, path="response"), self.pipeline.spec, "response",
                           self.voices)
        if spec.get("conversation", "auto") not in ("auto", "none"):
            raise ProtocolError("invalid_value", "conversation must be 'auto' or 'none'", "response.conversation")
        check_metadata(spec.get("metadata"), "response.metadata")
        return cfg

    def _turn_options(self, cfg: dict) -> GenerationOptions:
        limit, voice = cfg["max_output_tokens"], cfg["audio"]["output"]["voice"]
        return GenerationOptions(
            audio=cfg["output_modalities"][0] == "audio",
            **voice_options(voice, self.pipeline.spec, self.voices, "response.audio.output.voice"),
            max_text_tokens=self.limits.max_text_tokens if limit == "inf" else limit,
            max_frames=self.limits.max_frames if limit == "inf" else min(limit, self.limits.max_frames),
            tools=tuple(cfg["tools"]) if cfg["tool_choice"] != "none" else (), tool_choice=cfg["tool_choice"],
            ignore_eos=self.limits.ignore_eos)

    def _start_response(self, spec: dict, inputs: list[Item] | None = None) -> None:
        cfg = self._response_config(spec)
        out_of_band = spec.get("conversation", "auto") == "none"
        own_session = out_of_band or inputs is not None  # a pipeline session of its own, ended with the response
        held = self._take_held(spec, inputs)  # the reply started in the silence (early_reply.py), if it fits
        turn = held.turn if held is not None else Turn(*self._messages(cfg, inputs, out_of_band),
                                                        self._turn_options(cfg))
        output, voice = cfg["audio"]["output"], cfg["audio"]["output"]["voice"]
        response = Response(self.send, None if out_of_band else self.conversation, cfg["output_modalities"][0],
                            AudioFormat.from_config(output["format"]),
                            voice["id"] if isinstance(voice, dict) else voice,  # a response names its voice by a string
                            cfg["max_output_tokens"], spec.get("metadata"), turn_id=turn.turn_id,
                            started=self.committed_at or time.perf_counter(), rate=self.pipeline.spec.output_rate,
                            speed=float(output["speed"]), on_audio_start=self.metrics.ttfa.observe)
        response.on_cap = lambda: self.pipeline.abort(response.turn_id)
        self.committed_at = None
        self.response = response
        response.created()
        if held is not None:
            self.pipeline.release(turn.turn_id)
            events = held.events
        else:
            events = self.pipeline.submit(turn) if own_session else self._events(turn, response, cfg)
        self.task = asyncio.create_task(self._run(response, turn, events, own_session))

    def _messages(self, cfg: dict, inputs: list[Item] | None, out_of_band: bool) -> tuple[str, list[Message]]:
        """The pipeline session and the messages it has not seen yet (all of them after a reset)."""
        system = [Message("system", cfg["instructions"])] if cfg["instructions"] else []
        if out_of_band or inputs is not None:
            messages = system + to_messages(inputs if inputs is not None else self._context())
            if not messages:
                raise ProtocolError("invalid_value", "Nothing to respond to.", "response.input")
            return new_id("oob"), messages
        plan = self._plan(cfg, self._context())
        if not plan.messages:
            raise ProtocolError("invalid_value", "Nothing new in the conversation to respond to.")
        self._adopt(plan)
        return plan.session, plan.messages

    def _context(self) -> list[Item]:
        """The conversation as the model reads it: without the items truncation dropped."""
        return [i for i in self.conversation.items if i.id not in self.dropped]

    async def _events(self, turn: Turn, response: Response, cfg: dict) -> AsyncIterator[Event]:
        """The turn's events; one refused as too long for the context is retried (unless truncation is disabled) as a
        fresh prefill of the newest items (the retention ratio of them; `auto`: 3/4) until it fits or one is left."""
        truncation = cfg["truncation"]
        ratio = None if truncation == "disabled" else 0.75 if truncation == "auto" else truncation["retention_ratio"]
        while True:
            events = self.pipeline.submit(turn)
            first = await anext(events)
            items = self._context()
            keep = max(1, int(len(items) * (ratio or 0)))
            if ratio is None or not isinstance(first, TurnError) or first.code != "context_too_long" \
                    or keep >= len(items):
                break
            await events.aclose()
            self.dropped.update(i.id for i in items[: len(items) - keep])
            self.sent_context = None  # a new pipeline session: the kept items are prefilled again
            turn = Turn(*self._messages(cfg, None, False), turn.options)
            response.turn_id = turn.turn_id
        yield first
        async for event in events:
            yield event

    async def _run(self, response: Response, turn: Turn, events: AsyncIterator[Event], own_session: bool) -> None:
        start = time.perf_counter()
        try:
            await response.run(events)
        except Exception as e:  # never leave a client without response.done
            log.exception("response %s failed", response.id)
            response.fail(str(e))
        finally:
            if own_session:
                self.pipeline.end_session(turn.session_id)
            else:
                self.sent.extend(i.id for i in response.items)
            self.metrics.turn_timings(response.timings)
            if response.audio_samples:
                self.metrics.rtf.observe((time.perf_counter() - start) / (response.audio_samples / response.rate))
            logs.response_done(self.config["id"], response)
            ended = "cancelled" if response.status == "in_progress" else response.status  # cut off with the socket
            self.metrics.response_done(ended, response.error)
            if self.response is response:
                self.response = None
            if self.respond_after and self.response is None:
                self.respond_after = False
                try:
                    self._start_response({})
                except ProtocolError as e:
                    self.send(e.event(None))
                except Exception:
                    log.exception("response after a barge-in failed to start")
                    self.send(SERVER_ERROR.event(None))
            # GA: the idle timer starts once the reply's audio has played (its duration on from the next push)
            self._arm_idle = response.audio_ms

    def _cancel(self, reason: str) -> None:
        if self.response is not None and self.response.status == "in_progress":
            self.response.cancel_reason = reason
            self.pipeline.abort(self.response.turn_id)

