"""The HTTP/WebSocket server: /v1/realtime (the Realtime protocol), /health, /v1/models, /metrics, and
the browser demo at /."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import WSCloseCode, WSMsgType, web

from pipelines.pipeline import Pipeline

from .logs import SessionTrail
from .metrics import Metrics
from .session import Limits, RealtimeSession

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parents[1] / "web"
KEY_PROTOCOL = "openai-insecure-api-key."
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus text exposition


@dataclass(frozen=True)
class ServerConfig:
    model_name: str = "qwen3-omni"
    api_key: str | None = None
    max_sessions: int = 32
    max_session_s: float = 3600.0
    max_queued_events: int = 4096  # a client this far behind on reading is disconnected
    limits: Limits = Limits()


class Server:
    def __init__(self, pipeline: Pipeline, cfg: ServerConfig) -> None:
        self.pipeline, self.cfg = pipeline, cfg
        self.metrics = Metrics()
        self.started = time.time()
        self.sockets: set[web.WebSocketResponse] = set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_get("/v1/realtime", self.realtime)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_text)
        app.on_shutdown.append(self._close_sockets)
        if WEB_DIR.is_dir():
            app.router.add_get("/", self.index)
            app.router.add_static("/static/", WEB_DIR)
        return app

    async def _close_sockets(self, app: web.Application) -> None:
        for ws in list(self.sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")

    async def health(self, request: web.Request) -> web.Response:
        ok = self.pipeline.alive
        body = {"status": "ok" if ok else "engine_stopped", "model": self.cfg.model_name,
                "sessions": self.metrics.sessions,
                "last_error": None if self.pipeline.error is None else repr(self.pipeline.error)}
        return web.json_response(body, status=200 if ok else 503)

    async def models(self, request: web.Request) -> web.Response:
        if not self._authorized(request, None):
            return web.json_response({"error": {"message": "Invalid API key", "type": "invalid_request_error",
                                                "code": "invalid_api_key"}}, status=401)
        model = {"id": self.cfg.model_name, "object": "model", "created": int(self.started),
                 "owned_by": "omni-realtime"}
        return web.json_response({"object": "list", "data": [model]})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=await self.metrics.scrape(self.pipeline), headers={"Content-Type": CONTENT_TYPE})

    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB_DIR / "index.html")

    def _authorized(self, request: web.Request, key_protocol: str | None) -> bool:
        if not self.cfg.api_key:
            return True
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else (key_protocol or "")[len(KEY_PROTOCOL):]
        return hmac.compare_digest(given.encode(), self.cfg.api_key.encode())

    async def realtime(self, request: web.Request) -> web.StreamResponse:
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        key_protocol = next((p for p in offered if p.startswith(KEY_PROTOCOL)), None)
        if not self._authorized(request, key_protocol):
            return web.json_response({"error": {"message": "Invalid API key", "type": "invalid_request_error",
                                                "code": "invalid_api_key"}}, status=401)
        ws = web.WebSocketResponse(protocols=["realtime"] if "realtime" in offered else (), heartbeat=30,
                                   max_msg_size=32 * 1024 * 1024)
        await ws.prepare(request)
        if self.metrics.sessions >= self.cfg.max_sessions:
            self.metrics.rejected_total += 1
            await ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"server at max sessions; try again later")
            return ws
        self.metrics.sessions += 1
        self.metrics.sessions_total += 1
        self.sockets.add(ws)
        try:
            await self._serve(ws, request.query.get("model") or self.cfg.model_name)
        finally:
            self.metrics.sessions -= 1
            self.sockets.discard(ws)
        return ws

    async def _serve(self, ws: web.WebSocketResponse, model: str) -> None:
        outbox: asyncio.Queue[dict | None] = asyncio.Queue()
        too_slow = asyncio.Event()

        def send(event: dict) -> None:
            trail.saw(event)
            if outbox.qsize() >= self.cfg.max_queued_events:
                too_slow.set()  # never block the pipeline or other sessions on one slow reader
                return
            outbox.put_nowait(event)

        session = RealtimeSession(send, self.pipeline, model, self.metrics, self.cfg.limits)
        trail = SessionTrail(session.config["id"], model, self.metrics)
        writer = asyncio.create_task(self._write(ws, outbox))
        watchdog = asyncio.create_task(self._watch(ws, session, too_slow))
        session.start()
        try:
            async for msg in ws:
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    await session.handle(msg.data)
                elif msg.type == WSMsgType.ERROR:
                    break
        finally:
            await session.close()
            trail.closed(ws.close_code)
            watchdog.cancel()
            outbox.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer, timeout=5)
            writer.cancel()

    async def _write(self, ws: web.WebSocketResponse, outbox: asyncio.Queue[dict | None]) -> None:
        while (event := await outbox.get()) is not None:
            if ws.closed:
                return
            try:
                await ws.send_str(json.dumps(event))
            except (ConnectionResetError, RuntimeError):
                return

    async def _watch(self, ws: web.WebSocketResponse, session: RealtimeSession, too_slow: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(too_slow.wait(), timeout=self.cfg.max_session_s)
            log.warning("closing a session whose client does not read its events")
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"client is not reading events")
        except TimeoutError:
            session.send({"type": "error", "error": {"type": "invalid_request_error", "code": "session_expired",
                                                     "message": "Your session hit the maximum duration.",
                                                     "param": None, "event_id": None}})
            await asyncio.sleep(0.2)
            await ws.close(code=WSCloseCode.OK, message=b"session expired")


def run(pipeline: Pipeline, cfg: ServerConfig, sock: socket.socket, ssl_context: ssl.SSLContext | None = None) -> None:
    """Serve on `sock` (bound and listening already: a port in use fails before the model loads)."""
    server = Server(pipeline, cfg)
    with pipeline:
        web.run_app(server.app(), sock=sock, ssl_context=ssl_context, print=None)
