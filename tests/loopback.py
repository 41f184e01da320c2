"""The real server on 127.0.0.1 in a thread with its own event loop (no client library needed: the benchmarks
use it on the GPU machine too)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from pipelines.pipeline import Pipeline
from realtime.server import Server, ServerConfig


@contextmanager
def running(pipeline: Pipeline, cfg: ServerConfig, port: int = 0) -> Iterator[tuple[str, Server]]:
    """Serve on 127.0.0.1:<port> (0: a free one); yields (base_url for the openai SDK, server)."""
    server = Server(pipeline, cfg)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[web.AppRunner, int]:
        runner = web.AppRunner(server.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]

    runner, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield f"http://127.0.0.1:{port}/v1", server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
