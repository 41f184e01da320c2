"""Custom voices: which voice a request names (a model voice, an OpenAI voice, or `{"id": "voice_..."}` from the
store), and the HTTP API that makes them, as OpenAI's: /v1/audio/voice_consents and /v1/audio/voices."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import torch
from aiohttp import BodyPartReader, web

from pipelines.spec import ModelSpec

from .api_errors import ApiError, invalid, not_found
from .capabilities import OPENAI_VOICES
from .pcm import resample
from .voice_store import MAX_UPLOAD_BYTES, STORE_RATE, VoiceStore, decode_sample

SPEECH_VOICES = (*OPENAI_VOICES, "fable", "onyx", "nova")  # /v1/audio/speech knows three more than Realtime


def is_custom(voice: Any) -> bool:
    """`{"id": "voice_..."}`: a stored custom voice (an object with a model voice's name is that voice)."""
    return isinstance(voice, dict) and isinstance(voice.get("id"), str) and voice["id"].startswith("voice_")


class CustomVoices:
    """Turns a request's `voice` into GenerationOptions fields for the served model."""

    def __init__(self, spec: ModelSpec, store: VoiceStore | None) -> None:
        self.spec, self.store = spec, store

    def options(self, voice: Any, where: str = "voice") -> dict:
        """{"voice": ...} or a custom voice's fields; ValueError: a voice it cannot use, LookupError: no such id."""
        if isinstance(voice, dict) and set(voice) == {"id"}:
            if is_custom(voice):
                return self.custom(voice["id"], where)
            voice = voice["id"]
        if not isinstance(voice, str):
            raise ValueError(f"'{where}' must be a voice name or an object {{\"id\": \"voice_...\"}}.")
        if voice.lower() in SPEECH_VOICES:
            return {"voice": self.spec.default_voice}
        try:
            return {"voice": self.spec.voice(voice)}
        except ValueError as e:
            raise ValueError(f"Invalid value for '{where}': {e}, one of OpenAI's voices (which map to its "
                             f"default), or a custom voice {{\"id\": \"voice_...\"}}.") from None

    def custom(self, voice_id: str, where: str = "voice", load: bool = True) -> dict:
        """{"reference_audio": ...} for a stored voice (`load` False: only check that this model can use it)."""
        if self.store is None or self.store.voice(voice_id) is None:
            raise LookupError(f"No custom voice found with id '{voice_id}'.")
        if not self.spec.clones:
            raise ValueError(f"This model ({self.spec.name}) cannot speak in a custom voice (it does not clone "
                             f"voices): set '{where}' to one of its voices ({', '.join(self.spec.voices)}).")
        if not load:
            return {}
        rate = self.spec.output_rate  # a voice is cloned at the rate it speaks
        audio = torch.from_numpy(self.store.audio(voice_id))
        return {"reference_audio": resample(audio, STORE_RATE, rate) if rate != STORE_RATE else audio}


class VoiceApi:
    """The consent and voice endpoints over a VoiceStore; `authorized(request)` guards every one."""

    def __init__(self, store: VoiceStore, authorized: Callable[[web.Request], bool], executor: Executor) -> None:
        self.store, self.authorized, self.executor = store, authorized, executor

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/audio/voice_consents", self._guard(self.create_consent))
        app.router.add_get("/v1/audio/voice_consents", self._guard(self.list_consents))
        app.router.add_get("/v1/audio/voice_consents/{id}", self._guard(self.get_consent))
        app.router.add_post("/v1/audio/voice_consents/{id}", self._guard(self.update_consent))
        app.router.add_delete("/v1/audio/voice_consents/{id}", self._guard(self.delete_consent))
        app.router.add_post("/v1/audio/voices", self._guard(self.create_voice))
        app.router.add_get("/v1/audio/voices", self._guard(self.list_voices))
        app.router.add_get("/v1/audio/voices/{id}", self._guard(self.get_voice))
        app.router.add_delete("/v1/audio/voices/{id}", self._guard(self.delete_voice))

    def _guard(self, handler: Callable) -> Callable:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.authorized(request):
                return ApiError(401, "Invalid API key", None, "invalid_api_key").response()
            try:
                return await handler(request)
            except ApiError as e:
                return e.response()
        return guarded

    async def create_consent(self, request: web.Request) -> web.Response:
        fields = await _form(request, "recording")
        name, language = _text(fields, "name"), _text(fields, "language")
        recording = await self._decode(fields, "recording")
        return web.json_response(self.store.add_consent(name, language, recording).to_api())

    async def list_consents(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise invalid("limit", "'limit' must be an integer from 1 to 100.")
        return _page(*self.store.consents(request.query.get("after"), limit))

    async def get_consent(self, request: web.Request) -> web.Response:
        return _found(self.store.consent(request.match_info["id"]), "voice consent", request)

    async def update_consent(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise invalid("", "The request body must be a JSON object.", "invalid_json")
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise invalid("name", "'name' must be a non-empty string.")
        return _found(self.store.rename_consent(request.match_info["id"], name), "voice consent", request)

    async def delete_consent(self, request: web.Request) -> web.Response:
        if not self.store.delete_consent(request.match_info["id"]):
            raise not_found("voice consent", request.match_info["id"])
        return web.json_response({"id": request.match_info["id"], "deleted": True, "object": "audio.voice_consent"})

    async def create_voice(self, request: web.Request) -> web.Response:
        fields = await _form(request, "audio_sample")
        if fields.get("type", "audio_sample") != "audio_sample":
            raise invalid("type", "Only voices from an audio sample can be made here (type 'audio_sample').")
        name, consent = _text(fields, "name"), _text(fields, "consent")
        if self.store.consent(consent) is None:
            raise invalid("consent", f"No voice consent found with id '{consent}': create one first "
                          "(POST /v1/audio/voice_consents).")
        sample = await self._decode(fields, "audio_sample")
        return web.json_response(self.store.add_voice(name, consent, sample).to_api())

    async def list_voices(self, request: web.Request) -> web.Response:
        return _page(self.store.voices(), False)

    async def get_voice(self, request: web.Request) -> web.Response:
        return _found(self.store.voice(request.match_info["id"]), "voice", request)

    async def delete_voice(self, request: web.Request) -> web.Response:
        if not self.store.delete_voice(request.match_info["id"]):
            raise not_found("voice", request.match_info["id"])
        return web.json_response({"id": request.match_info["id"], "deleted": True, "object": "audio.voice.deleted"})

    async def _decode(self, fields: dict, name: str) -> Any:
        data = fields.get(name)
        if not isinstance(data, bytes):
            raise invalid(name, f"Missing required file: '{name}'.", "missing_required_parameter")
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, decode_sample, data,
                                                                    name.replace("_", " "))
        except ValueError as e:
            raise invalid(name, str(e), "invalid_audio") from None


async def _form(request: web.Request, file_field: str) -> dict[str, str | bytes]:
    """A multipart form's fields (text) and its one file (bytes), read within MAX_UPLOAD_BYTES."""
    if not request.content_type.startswith("multipart/"):
        raise invalid(file_field, "The request must be multipart/form-data with the audio file as "
                      f"'{file_field}'.", "invalid_request")
    fields: dict[str, str | bytes] = {}
    total = 0
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader) or not part.name:
            continue
        data = bytearray()
        while chunk := await part.read_chunk(64 * 1024):
            data += chunk
            total += len(chunk)
            if total > MAX_UPLOAD_BYTES + 64 * 1024:  # the file plus its few text fields
                raise ApiError(413, f"'{part.name}' is larger than {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB.",
                               part.name, "file_too_large")
        fields[part.name] = bytes(data) if part.name == file_field else data.decode("utf-8", "replace")
    return fields


def _page(items: list, more: bool) -> web.Response:
    return web.json_response({"object": "list", "data": [i.to_api() for i in items], "has_more": more,
                              "first_id": items[0].id if items else None, "last_id": items[-1].id if items else None})


def _found(row: Any, what: str, request: web.Request) -> web.Response:
    if row is None:
        raise not_found(what, request.match_info["id"])
    return web.json_response(row.to_api())


def _text(fields: dict, name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value.strip():
        raise invalid(name, f"Missing required parameter: '{name}'.", "missing_required_parameter")
    return value
