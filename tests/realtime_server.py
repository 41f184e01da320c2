"""The real server on loopback, in a thread with its own event loop, for the gateway tests."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from realtime.server import Server
from tests.loopback import running  # noqa: F401 (the tests import it from here)

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)


def client(base_url: str, key: str = "test-key") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


async def next_event(conn, timeout: float = 120.0) -> dict:
    """The next server event as a dict, after validating it against the SDK's typed models."""
    raw = await asyncio.wait_for(conn.recv_bytes(), timeout)
    event = json.loads(raw)
    SERVER_EVENT.validate_python(event)
    return event


async def until(conn, kind: str, seen: list[dict] | None = None, timeout: float = 120.0) -> dict:
    """Events up to and including the first of type `kind` (collected into `seen`)."""
    while True:
        event = await next_event(conn, timeout)
        if seen is not None:
            seen.append(event)
        if event["type"] == kind:
            return event


def errors_by_code(server: Server) -> dict[str, int]:
    """Error events sent to clients so far, by code (the server's `omni_errors_total` counter)."""
    return {s.labels["code"]: int(s.value) for m in server.metrics.registry.collect() for s in m.samples
            if s.name == "omni_errors_total"}


async def append_audio(conn, samples: np.ndarray, chunk_s: float = 0.1) -> None:
    """Stream 24 kHz samples through an SDK connection as `input_audio_buffer.append` events."""
    step = int(24000 * chunk_s)
    for i in range(0, len(samples), step):
        await conn.input_audio_buffer.append(audio=pcm16_b64(samples[i : i + step]))
