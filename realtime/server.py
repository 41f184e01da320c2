"""The HTTP/WebSocket server: /v1/realtime, /health, /v1/models, /metrics, /v1/audio/* and the browser demo."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import socket
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from aiohttp import WSCloseCode, WSMsgType, web

from pipelines.pipeline import Pipeline

from .drain import Drain, DrainConfig
from .input_audio import AudioWorkers
from .logs import SessionTrail
from .metrics import Metrics
from .protocol import MAX_EVENT_CHARS, ProtocolError
from .readiness import Readiness
from .security import KEY_PROTOCOL, Gate, is_loopback, key_matches, redact_logs
from .session import Limits, RealtimeSession
from .speech import speak
from .voice_store import VoiceStore, default_data_dir
from .voices import CustomVoices, VoiceApi

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parents[1] / "web"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus text exposition


@dataclass(frozen=True)
class ServerConfig:
    model_name: str = ""  # the model id /v1/models reports ("": the model's own name, its spec's)
    api_key: str | None = None
    max_sessions: int = 32
    max_sessions_per_client: int = 16  # per client address
    max_session_s: float = 3600.0
    max_queued_events: int = 4096  # a client this far behind on reading is disconnected...
    max_queued_bytes: int = 16 * 1024 * 1024  # ...or this many bytes behind
    close_timeout_s: float = 2.0  # the longest a close handshake may take before the connection is cut
    allowed_origins: tuple[str, ...] = ()  # browser origins besides the server's own host ("*": any)
    bind_host: str = "127.0.0.1"  # loopback: localhost origins of any port are allowed too
    audio_workers: int = 2  # threads for the sessions' audio work
    # the longest a thread holds the GIL while another waits (Python's default: 5 ms); the engine thread waits this long
    # for it at every torch call (0.1 against 0.5: lower p95, less starved audio at 128 conversations, RESULTS.md, 8th)
    gil_switch_ms: float = 0.1
    limits: Limits = Limits()
    drain: DrainConfig = DrainConfig()
    data_dir: Path | None = None  # custom voices (None: voice_store.default_data_dir())


class Outbox:
    """A session's events on their way to the socket, bounded in count and bytes (a client so far behind is cut)."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.max_events, self.max_bytes, self.bytes = max_events, max_bytes, 0
        self.overflow = asyncio.Event()
        self.closing = False

    def put(self, event: dict) -> None:
        if self.overflow.is_set():
            return
        text = json.dumps(event)
        # the bound is on what the client left unread: one event on an empty backlog is never a slow reader
        if self.queue.qsize() >= self.max_events or self.bytes and self.bytes + len(text) > self.max_bytes:
            self.overflow.set()  # never block the pipeline or other sessions on one slow reader
            return
        self.bytes += len(text)
        self.queue.put_nowait(text)

    async def get(self) -> str | None:
        text = await self.queue.get()
        self.bytes -= len(text or "")
        return text

    def end(self) -> None:
        self.queue.put_nowait(None)


class Server:
    def __init__(self, pipeline: Pipeline, cfg: ServerConfig) -> None:
        self.pipeline, self.cfg = pipeline, cfg if cfg.model_name else replace(cfg, model_name=pipeline.spec.name)
        self.metrics = Metrics()
        self.started = time.time()
        self.gate = Gate(cfg.api_key, cfg.allowed_origins, is_loopback(cfg.bind_host))
        self.sockets: dict[web.WebSocketResponse, web.Request] = {}
        self.per_client: Counter[str] = Counter()
        self.audio = AudioWorkers(cfg.audio_workers)
        sys.setswitchinterval(cfg.gil_switch_ms / 1000)
        self.drain = Drain(cfg.drain, lambda: self.metrics.sessions)
        self.readiness = Readiness(pipeline, self.metrics, cfg.max_sessions, lambda: self.drain.draining)
        self.voice_store = VoiceStore(cfg.data_dir or default_data_dir())
        self.voices = CustomVoices(pipeline.spec, self.voice_store)
        self.speaking = 0  # /v1/audio/speech requests in flight (at most max_sessions)
        redact_logs(cfg.api_key)
        _return_large_frees()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024, middlewares=[self._check_browser])
        app.router.add_get("/v1/realtime", self.realtime)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health/ready", self.ready)
        app.on_startup.append(self.readiness.on_startup)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_text)
        app.router.add_post("/v1/audio/speech", self.speech)
        VoiceApi(self.voice_store, lambda request: self._authorized(request, None), self.audio).add_routes(app)
        app.on_shutdown.append(self._close_sockets)
        app.on_cleanup.append(self._stop_workers)
        if WEB_DIR.is_dir():
            app.router.add_get("/", self.index)
            app.router.add_static("/static/", WEB_DIR)
        return app

    @web.middleware
    async def _check_browser(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        host = request.headers.get("Host", "")
        if not self.gate.host_ok(host):
            return _refuse(403, "host_not_allowed", "Host not allowed: set --api-key or list it in --allowed-origins.")
        if not self.gate.origin_ok(request.headers.get("Origin"), host):
            return _refuse(403, "origin_not_allowed", "Origin not allowed: list it in --allowed-origins.")
        return await handler(request)

    async def _close_sockets(self, app: web.Application) -> None:
        log.info("shutting down: closing %d sockets", len(self.sockets))
        await asyncio.gather(*(self._close(ws, request, WSCloseCode.GOING_AWAY, b"server shutting down")
                               for ws, request in list(self.sockets.items())), return_exceptions=True)
        log.info("sockets closed")

    async def _stop_workers(self, app: web.Application) -> None:
        self.audio.shutdown(wait=False, cancel_futures=True)
        self.voice_store.close()

    async def _close(self, ws: web.WebSocketResponse, request: web.Request, code: int, message: bytes) -> None:
        """The close handshake, bounded in time; a client that does not take the close frame is cut off."""
        done = False
        try:
            await asyncio.wait_for(ws.close(code=code, message=message), self.cfg.close_timeout_s)
            done = True
        except Exception:
            pass
        finally:
            transport = request.transport
            if transport is not None and (not done or transport.get_write_buffer_size()):
                transport.abort()

    async def health(self, request: web.Request) -> web.Response:
        """Liveness for anyone; the internals only for a caller with the key."""
        ok = self.pipeline.alive
        body: dict = {"status": "ok" if ok else "engine_stopped"}
        if self.cfg.api_key and self._authorized(request, None):
            body |= {"model": self.cfg.model_name, "sessions": self.metrics.sessions,
                     "capacity": self.pipeline.capacity(),
                     "last_error": None if self.pipeline.error is None else repr(self.pipeline.error)}
        return web.json_response(body, status=200 if ok else 503)

    async def ready(self, request: web.Request) -> web.Response:
        reason = await self.readiness.reason()
        return web.json_response({"status": reason or "ready"}, status=503 if reason else 200)

    async def models(self, request: web.Request) -> web.Response:
        if not self._authorized(request, None):
            return _refuse(401, "invalid_api_key", "Invalid API key")
        model = {"id": self.cfg.model_name, "object": "model", "created": int(self.started),
                 "owned_by": "omni-realtime", "capabilities": self.pipeline.spec.capabilities()}
        return web.json_response({"object": "list", "data": [model]})

    async def speech(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request, None):
            return _refuse(401, "invalid_api_key", "Invalid API key")
        if self.drain.refusing():
            return _refuse(503, "server_draining", "The server is shutting down: try another replica.")
        if self.speaking >= self.cfg.max_sessions:
            return _refuse(429, "rate_limit_exceeded", f"Too many speech requests at once ({self.speaking}).")
        self.speaking += 1
        try:
            return await speak(request, self.pipeline, self.voices, self.cfg.limits)
        finally:
            self.speaking -= 1

    async def metrics_text(self, request: web.Request) -> web.Response:
        if not self._authorized(request, None):
            return _refuse(401, "invalid_api_key", "Invalid API key")
        return web.Response(body=await self.metrics.scrape(self.pipeline), headers={"Content-Type": CONTENT_TYPE})

    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB_DIR / "index.html")

    def _authorized(self, request: web.Request, key_protocol: str | None) -> bool:
        if not self.cfg.api_key:
            return True
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else (key_protocol or "")[len(KEY_PROTOCOL):]
        return key_matches(given, self.cfg.api_key)

    async def realtime(self, request: web.Request) -> web.StreamResponse:
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        key_protocol = next((p for p in offered if p.startswith(KEY_PROTOCOL)), None)
        if not self._authorized(request, key_protocol):
            return _refuse(401, "invalid_api_key", "Invalid API key")
        if request.query.get("intent") == "transcription" and not self.pipeline.spec.transcribes:
            return _refuse(400, "invalid_value", f"This model ({self.cfg.model_name}) cannot transcribe audio.")
        ws = web.WebSocketResponse(protocols=["realtime"] if "realtime" in offered else (), heartbeat=30,
                                   max_msg_size=MAX_EVENT_CHARS, timeout=self.cfg.close_timeout_s)
        await ws.prepare(request)
        client = request.remote or "unknown"
        refusal = b"server is draining" if self.drain.refusing() else b"server at max sessions" \
            if self.metrics.sessions >= self.cfg.max_sessions else b"too many sessions from this address" \
            if self.per_client[client] >= self.cfg.max_sessions_per_client else None
        if refusal is not None:
            self.metrics.rejected_total += 1
            await self._close(ws, request, WSCloseCode.TRY_AGAIN_LATER, refusal)
            return ws
        self.metrics.sessions += 1
        self.metrics.sessions_total += 1
        self.per_client[client] += 1
        self.sockets[ws] = request
        released = False

        def release() -> None:
            """Free the slot, once: at the close or as soon as the server decides to drop the client."""
            nonlocal released
            if not released:
                released = True
                self.metrics.sessions -= 1
                self.per_client[client] -= 1
                if not self.per_client[client]:
                    del self.per_client[client]
                self.sockets.pop(ws, None)

        try:
            await self._serve(ws, request, request.query.get("model") or self.cfg.model_name, release)
        finally:
            release()
        return ws

    async def _serve(self, ws: web.WebSocketResponse, request: web.Request, model: str,
                     release: Callable[[], None]) -> None:
        outbox = Outbox(self.cfg.max_queued_events, self.cfg.max_queued_bytes)

        def send(event: dict) -> None:
            trail.saw(event)
            outbox.put(event)

        session = RealtimeSession(send, self.pipeline, model, self.metrics, self.cfg.limits, self.audio,
                                  intent=request.query.get("intent"), voices=self.voices)
        trail = SessionTrail(session.config["id"], model, self.metrics)
        writer = asyncio.create_task(self._write(ws, outbox))
        watchdog = asyncio.create_task(self._watch(ws, request, session, outbox, release))
        session.start()
        try:
            async for msg in ws:
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    await session.handle(msg.data)
                    await asyncio.sleep(0)  # a client with many frames buffered takes turns with the others
                elif msg.type == WSMsgType.ERROR:
                    break
                del msg  # a frame of many MiB must not stay alive while the client idles
        finally:
            await session.close()
            if outbox.closing:  # let the watchdog finish its bounded close
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(watchdog), self.cfg.close_timeout_s + 1)
            trail.closed(ws.close_code)
            watchdog.cancel()
            outbox.end()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer, timeout=self.cfg.close_timeout_s)
            writer.cancel()

    async def _write(self, ws: web.WebSocketResponse, outbox: Outbox) -> None:
        while (text := await outbox.get()) is not None:
            if ws.closed:
                return
            try:
                await ws.send_str(text)
            except (ConnectionResetError, RuntimeError):
                return

    async def _watch(self, ws: web.WebSocketResponse, request: web.Request, session: RealtimeSession,
                     outbox: Outbox, release: Callable[[], None]) -> None:
        try:
            await asyncio.wait_for(outbox.overflow.wait(), timeout=self.cfg.max_session_s)
        except TimeoutError:
            session.send(ProtocolError("session_expired", "Your session hit the maximum duration.").event(None))
            await asyncio.sleep(0.2)
            outbox.closing = True
            await self._close(ws, request, WSCloseCode.OK, b"session expired")
            return
        log.warning("closing a session whose client does not read its events")
        outbox.closing = True
        release()
        await self._close(ws, request, WSCloseCode.POLICY_VIOLATION, b"client is not reading events")


def _return_large_frees() -> None:
    """glibc raises its mmap threshold as big blocks are freed and keeps them (16 MiB frames left ~64 MiB held): a
    fixed threshold maps every block of 1 MiB or more on its own, so freeing it gives it back to the system."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD


def freeze_loaded() -> None:
    """What exists before serving (model, graphs, tokenizer: 0.33 M objects with the tiny model) leaves the collector's
    view: a full collection scans them all while every thread waits (170 ms on the CPU box; 240 ms with the full model
    in a 64-session burst on the H200, a stall for every playing stream: RESULTS.md, fifteenth session)."""
    gc.collect()
    gc.freeze()


def _refuse(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": code}},
                             status=status)


def run(pipeline: Pipeline, cfg: ServerConfig, sock: socket.socket, ssl_context: ssl.SSLContext | None = None,
        started: Callable[[], None] = lambda: None) -> None:
    """Serve on `sock` (bound already: a port in use fails before the model loads) until a signal's drain ends.
    `started` runs once the signal handlers are in place, so a signal sent after it always drains."""
    server = Server(pipeline, cfg)
    app = server.app()
    freeze_loaded()
    app.on_startup.append(server.drain.install_signals)

    async def announce(_: web.Application) -> None:
        started()

    app.on_startup.append(announce)
    with pipeline:
        web.run_app(app, sock=sock, ssl_context=ssl_context, print=None, handle_signals=False,
                    shutdown_timeout=cfg.close_timeout_s + 1)
        log.info("server stopped; stopping the engine")
