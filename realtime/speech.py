"""POST /v1/audio/speech, as OpenAI's: a text read aloud by the served model, streamed as encoded audio
(`stream_format` "audio") or as server-sent `speech.audio.delta` / `speech.audio.done` events ("sse")."""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

from pipelines.pipeline import Pipeline
from pipelines.types import AudioChunk, GenerationOptions, Message, Turn, TurnDone, TurnError, new_id

from .api_errors import ApiError, invalid
from .audio import TimeStretch
from .encode import FORMATS, Encoder
from .session import Limits
from .voices import CustomVoices

log = logging.getLogger(__name__)
MAX_INPUT_CHARS = 4096
MIN_SPEED, MAX_SPEED = 0.25, 4.0
STREAM_FORMATS = ("audio", "sse")


@dataclass(frozen=True)
class SpeechRequest:
    input: str
    options: GenerationOptions
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"


def parse_request(body: Any, pipeline: Pipeline, voices: CustomVoices, limits: Limits) -> SpeechRequest:
    """The request if the served model can read it aloud as asked; ApiError in OpenAI's shape otherwise."""
    spec = pipeline.spec
    if not isinstance(body, dict):
        raise invalid("", "The request body must be a JSON object.", "invalid_request")
    if not spec.reads_aloud:
        raise ApiError(400, f"This model ({spec.name}) does not read text aloud: /v1/audio/speech needs a "
                       "text-to-speech model (serve one whose capabilities show speech: true).", "model",
                       "model_not_supported")
    unknown = sorted(set(body) - {"model", "input", "voice", "instructions", "response_format", "speed",
                                  "stream_format"})
    if unknown:
        raise invalid(unknown[0], f"Unrecognized request argument supplied: {unknown[0]}", "unknown_parameter")
    for name in ("model", "input", "voice"):
        if name not in body:
            raise invalid(name, f"Missing required parameter: '{name}'.", "missing_required_parameter")
    text = body["input"]
    if not isinstance(text, str) or not text.strip():
        raise invalid("input", "'input' must be a non-empty string.")
    if len(text) > MAX_INPUT_CHARS:
        raise invalid("input", f"'input' is {len(text)} characters long; the maximum is {MAX_INPUT_CHARS}.",
                      "string_above_max_length")
    instructions = body.get("instructions") or ""
    if not isinstance(instructions, str):
        raise invalid("instructions", "'instructions' must be a string.")
    if instructions and not spec.instructions:
        raise invalid("instructions", f"This model ({spec.name}) does not take speaking instructions: "
                      "leave 'instructions' out.")
    fmt = body.get("response_format", "mp3")
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise invalid("response_format", f"Invalid value for 'response_format': {fmt!r}; supported: "
                      f"{', '.join(FORMATS)}.")
    stream = body.get("stream_format", "audio")
    if not isinstance(stream, str) or stream not in STREAM_FORMATS:
        raise invalid("stream_format", f"Invalid value for 'stream_format': {stream!r}; supported: audio, sse.")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise invalid("speed", f"'speed' must be a number from {MIN_SPEED} to {MAX_SPEED}; got {speed!r}.")
    try:
        voice = voices.options(body["voice"], "voice")
    except ValueError as e:
        raise invalid("voice", str(e)) from None
    except LookupError as e:
        raise ApiError(404, str(e), "voice", "voice_not_found") from None
    options = GenerationOptions(instructions=instructions, max_text_tokens=limits.max_text_tokens,
                                max_frames=limits.max_frames, **voice)
    return SpeechRequest(text, options, fmt, float(speed), stream)


class SpeechStream:
    """One request's audio: the model's chunks, time-scaled for `speed`, encoded, framed for the stream."""

    def __init__(self, req: SpeechRequest, rate: int) -> None:
        self.req = req
        self.encoder = Encoder(req.response_format, rate)
        self.stretch = TimeStretch(req.speed, rate) if req.speed != 1 else None

    def chunk(self, pcm: np.ndarray) -> bytes:
        return self._frame(self.encoder.push(self.stretch.push(pcm) if self.stretch else pcm))

    def done(self, event: TurnDone) -> bytes:
        rest = self.stretch.flush() if self.stretch else np.zeros(0, np.float32)
        out = self._frame(self.encoder.push(rest) + self.encoder.flush())
        if self.req.stream_format == "sse":
            u = event.usage
            output = u.audio_frames or u.output_tokens  # audio tokens: one per codec frame
            usage = {"input_tokens": u.input_tokens, "output_tokens": output, "total_tokens": u.input_tokens + output}
            out += _sse({"type": "speech.audio.done", "usage": usage})
        return out

    def error(self, event: TurnError) -> bytes:
        """An SSE error event; a raw audio stream can only be cut short (the caller aborts the connection)."""
        return _sse({"type": "error", "error": {"message": event.message, "type": "server_error",
                                                "param": None, "code": event.code}})

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.req.stream_format == "sse" else self.encoder.format.content_type

    def _frame(self, data: bytes) -> bytes:
        if self.req.stream_format == "audio" or not data:
            return data
        return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})


def _sse(event: dict) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


async def speak(request: web.Request, pipeline: Pipeline, voices: CustomVoices, limits: Limits) -> web.StreamResponse:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return invalid("", "The request body is not valid JSON.", "invalid_json").response()
    try:
        req = parse_request(body, pipeline, voices, limits)
    except ApiError as e:
        return e.response()
    turn = Turn(new_id("speech"), [Message("user", req.input)], req.options)
    stream = SpeechStream(req, pipeline.spec.output_rate)
    events = pipeline.submit(turn)
    response: web.StreamResponse | None = None
    try:
        async for event in events:
            if response is None and isinstance(event, TurnError):
                return ApiError(500 if event.code == "server_error" else 400, event.message, None, event.code,
                                "server_error" if event.code == "server_error" else "invalid_request_error"
                                ).response()
            if response is None:
                response = web.StreamResponse(headers={"Content-Type": stream.content_type})
                response.enable_chunked_encoding()
                await response.prepare(request)
            if isinstance(event, AudioChunk):
                data = stream.chunk(event.pcm)
            elif isinstance(event, TurnDone):
                data = stream.done(event)
            elif isinstance(event, TurnError):
                log.warning("speech %s failed mid-stream: %s", turn.turn_id, event.message)
                if req.stream_format == "audio":
                    if request.transport is not None:  # the client sees a cut stream, not a short file
                        request.transport.abort()
                    return response
                data = stream.error(event)
            else:
                continue
            if data:
                await response.write(data)
        await response.write_eof()
        return response
    finally:
        await events.aclose()
        stream.encoder.close()
        pipeline.end_session(turn.session_id)
