"""Graceful drain on SIGTERM or SIGINT (README "Security model"; deploy/README.md); a second signal stops at once."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp.web import GracefulExit

from . import logs

POLL_S = 0.1


@dataclass(frozen=True)
class DrainConfig:
    window_s: float = 30.0  # the longest a drain lasts; keep it below the orchestrator's kill deadline
    notice_s: float = 0.0  # new sessions are still taken this long after the signal (proxy check interval x fall)


class Drain:
    def __init__(self, cfg: DrainConfig, open_sessions: Callable[[], int]) -> None:
        self.cfg, self.open_sessions = cfg, open_sessions
        self.started: float | None = None
        self._task: asyncio.Task | None = None

    @property
    def draining(self) -> bool:
        return self.started is not None

    def refusing(self) -> bool:
        return self.started is not None and time.monotonic() - self.started >= self.cfg.notice_s

    async def install_signals(self, app: object) -> None:
        """An aiohttp on_startup hook for the process's own server (`run_app(handle_signals=False)`)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.signal, sig)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.started is not None:
            logs.event("stopping_now", signal=signal.Signals(sig).name, sessions=self.open_sessions())
            raise GracefulExit()  # propagates out of the event loop: run_app shuts down (1001 to every socket)
        self.started = time.monotonic()
        logs.event("draining", signal=signal.Signals(sig).name, sessions=self.open_sessions(),
                   window_s=self.cfg.window_s, notice_s=self.cfg.notice_s)
        self._task = asyncio.get_running_loop().create_task(self._wait())

    async def _wait(self) -> None:
        assert self.started is not None
        deadline = self.started + self.cfg.window_s
        while time.monotonic() < deadline:
            if self.open_sessions() == 0 and self.refusing():
                break
            await asyncio.sleep(POLL_S)
        logs.event("drained", seconds=round(time.monotonic() - self.started, 3), sessions_left=self.open_sessions())
        asyncio.get_running_loop().call_soon(_exit)


def _exit() -> None:
    raise GracefulExit()
