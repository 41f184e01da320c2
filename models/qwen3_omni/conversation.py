"""Per-session and per-turn state of a Qwen3-Omni conversation. A Session keeps every thinker input (ids and
embeddings: an evicted cache is recomputed exactly) and its user turns' talker rows; a TurnState is one reply."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from models.common.rows import Rows
from models.common.speaking import SpeakingState
from models.common.tokenizer import StreamDecoder
from pipelines.types import Event, TextDelta, TurnDone, Usage

from .audio_stream import AudioStream
from .spec import TurnSettings
from .talker_prompt import TtsEmbeds
from .tools import parse_tool_calls


@dataclass(frozen=True)
class SessionMark:
    """A session's lengths at one moment: what a discarded held turn rolls back to."""

    ids: int
    talker_rows: int
    talker_done_upto: int
    kv_length: int


@dataclass
class Session:
    id: str
    ids: list[int] = field(default_factory=list)  # thinker inputs, fed or still pending
    embeds: Rows = field(default_factory=Rows)  # their input embeddings, aligned with ids
    talker_users: Rows = field(default_factory=Rows)  # talker rows of every user turn so far
    talker_done_upto: int = 0  # ids before this index have their user rows in talker_users
    turn: TurnState | None = None
    replies: dict[str, tuple[int, list[int]]] = field(default_factory=dict)  # turn -> (start in ids, reply ids)

    def truncate(self, length: int) -> None:
        """Forget every input from `length` on (the caller rolls the KV cache back)."""
        del self.ids[length:]
        self.embeds.truncate(length)
        self.talker_done_upto = min(self.talker_done_upto, length)

    @property
    def kv_key(self) -> str:
        return f"thinker:{self.id}"


@dataclass
class TurnState(SpeakingState):
    turn_id: str
    session: Session
    options: TurnSettings
    emit_event: Callable[[Event], None]
    decoder: StreamDecoder
    im_end: int
    tts: TtsEmbeds | None  # None: the model does not speak
    rate: int  # output audio samples per second
    prompt_ids: list[int] = field(default_factory=list)  # this turn's new thinker inputs
    cached_tokens: int = 0
    audio_features: list[torch.Tensor | AudioStream] = field(default_factory=list)  # or encoded as it arrived
    prompt_ready: bool = False
    speaking: bool = True  # False for text-only turns and for replies that are tool calls
    tool_call_id: int = -1  # the token that opens a tool call (<tool_call>)
    audio_token_id: int = -1  # audio_pad: one input token of audio
    # (sampled token, embedding) -> the ones kept: tool_choice "required" or a function (forced_call.py)
    force: Callable[[int, torch.Tensor], tuple[int, torch.Tensor]] | None = None
    reply_ids: list[int] = field(default_factory=list)
    thinker_done: bool = False
    text_stop: str = "completed"
    head_embeds: torch.Tensor | None = None  # thinker embeds of <|im_start|>assistant\n + reply token 0
    trailing: list[torch.Tensor] = field(default_factory=list)  # talker text rows for decode steps

    @property
    def reply_done(self) -> bool:
        """The reply has all its tokens (what a voice reads: pipelines/voice.py)."""
        return self.thinker_done

    def urgency(self) -> float:
        if not self.speaking or self.options.background or self.held:
            return float("inf")
        return self.audio_urgency()

    def on_prompt_embeds(self, embeds: torch.Tensor) -> None:
        self.session.ids.extend(self.prompt_ids)
        self.session.embeds.append(embeds)
        self.session.replies[self.turn_id] = (len(self.session.ids), self.reply_ids)
        self.prompt_ready = True
        self.mark("prompt_ms")

    def on_token(self, token: int, embed: torch.Tensor, projected: torch.Tensor | None) -> None:
        """A sampled reply token, its input row `embed` [1, D]; `projected` is its talker text row (when speaking)."""
        if self.force is not None:
            token, embed = self.force(token, embed)
        first = not self.reply_ids
        if first:
            self.mark("first_text_ms")
        self.reply_ids.append(token)
        self.session.ids.append(token)
        self.session.embeds.append(embed)
        if first and token == self.tool_call_id:  # a function call is not spoken
            self.speaking, self.audio_done = False, True
        in_call = self.reply_ids[0] == self.tool_call_id
        self.emit(TextDelta(self.turn_id, self.decoder.push(token), (token,), tool_call=in_call))
        final = token == self.im_end or len(self.reply_ids) >= self.options.max_text_tokens
        if self.speaking and self.tts is not None:  # this model's own talker (not another model's voice)
            if first:
                self.head_embeds = self.session.embeds.tail(self.session.embeds.n - 4)
            elif not final:
                self.trailing.append(projected)
            if final:
                self.trailing.append(self.tts.eos)
        if final:
            self.thinker_done = True
            self.text_stop = "completed" if token == self.im_end else "length"
            self.maybe_finish()

    def maybe_finish(self) -> bool:
        if self.finished or not self.thinker_done or (self.speaking and not self.audio_done):
            return False
        self.finish("completed" if "length" not in (self.text_stop, self.audio_stop) else "length")
        return True

    def finish(self, status: str) -> None:
        if self.finished:
            return
        timings = self.timings(time.perf_counter())
        tail = self.decoder.flush()
        if tail:
            self.emit(TextDelta(self.turn_id, tail, ()))
        n_input = len(self.prompt_ids) + self.cached_tokens
        audio_in = self.session.ids[:n_input].count(self.audio_token_id)
        usage = Usage(n_input, self.cached_tokens, len(self.reply_ids), len(self.codes), audio_in)
        text = self.decoder.tokenizer.decode(self.reply_ids, skip_special=True)
        is_call = bool(self.reply_ids) and self.reply_ids[0] == self.tool_call_id
        calls, invalid = parse_tool_calls(text) if is_call else ([], [])
        self.emit(TurnDone(self.turn_id, status, text, tuple(self.reply_ids), tuple(map(tuple, self.codes)),
                           usage, timings, tuple(calls), tuple(invalid)))
        self._close()

