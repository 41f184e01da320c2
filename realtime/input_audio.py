"""A session's input audio work off the event loop (decoding appends, turn detection, item audio); the append rate."""

from __future__ import annotations

import base64
import binascii
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from .audio import AudioFormat, decode, encode, to_model_rate
from .protocol import ProtocolError
from .vad import ServerVad


def decode_append(data: str, fmt: AudioFormat, vad: ServerVad | None,
                  arm_idle: int | None) -> tuple[torch.Tensor, list]:
    """One append, on the worker: base64 -> samples, and the turn detector's events. `arm_idle`: start the
    idle timer that many ms after the audio clock's position (a reply still playing)."""
    try:
        pcm = decode(base64.b64decode(data, validate=True), fmt)
    except (binascii.Error, ValueError) as e:
        raise ProtocolError("invalid_value", f"Invalid 'audio': not valid base64 audio ({e}).", "audio") from None
    if vad is None:
        return pcm, []
    if arm_idle is not None:
        vad.arm_idle(vad.position_ms + arm_idle)
    return pcm, vad.push(to_model_rate(pcm, fmt, vad.rate))


def encoded(audio: torch.Tensor, fmt: AudioFormat, rate: int) -> str:
    """A user item's audio (kept at the model's input `rate`) as base64 in the session's input format."""
    return base64.b64encode(encode(audio, fmt, rate)).decode()


class AppendRate:
    """Token bucket: `rate` appends a second sustained, bursts of up to `burst`."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst, self.tokens, self.refilled = rate, burst, float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens, self.refilled = min(self.burst, self.tokens + (now - self.refilled) * self.rate), now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class AudioWorkers(ThreadPoolExecutor):
    """The sessions' audio worker threads, and whether any job is queued or running on them (`idle`)."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="audio")
        self.jobs = 0
        self._count = threading.Lock()

    @property
    def idle(self) -> bool:
        return self.jobs == 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._count:
            self.jobs += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._done(None)
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, _: Future | None) -> None:
        with self._count:
            self.jobs -= 1


@functools.cache
def default_workers() -> AudioWorkers:
    """The audio workers of sessions made without the server's."""
    return AudioWorkers(2)
