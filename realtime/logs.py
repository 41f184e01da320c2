"""Structured log lines (text `event key=value ...`, or JSON): session open and close, responses, client errors."""

from __future__ import annotations

import json
import logging
import time

from .metrics import Metrics

log = logging.getLogger("omni_realtime")
CLOSE_REASONS = {1000: "normal", 1001: "going_away", 1006: "abnormal", 1008: "client_not_reading",
                 1009: "message_too_big", 1011: "server_error", 1013: "try_again_later"}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record), "level": record.levelname.lower(), "logger": record.name,
               "message": record.getMessage(), **getattr(record, "fields", {})}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def _text(v: object) -> str:
    s = f"{v:.3f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)
    return json.dumps(s) if not s or any(c in s for c in ' "=') else s


def setup(level: str = "info", json_lines: bool = False) -> None:
    handler = logging.StreamHandler()
    text = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter(text))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(name: str, level: int = logging.INFO, **fields: object) -> None:
    log.log(level, name, extra={"fields": {k: v for k, v in fields.items() if v is not None}})


def response_done(session_id: str, response) -> None:
    """One line per response: status, time to first audio, seconds of audio (a realtime.response.Response)."""
    error = (response.error or {}).get("code")
    event("response", logging.WARNING if response.status == "failed" else logging.INFO, session=session_id,
          response=response.id, status=response.status, reason=response.reason, error=error,
          ttfa_ms=None if response.first_audio_s is None else round(response.first_audio_s * 1000),
          audio_s=round(response.audio_ms / 1000, 2))


class SessionTrail:
    """Watches one session's outgoing events: logs its open, close and every error; counts active responses."""

    def __init__(self, session_id: str, model: str, metrics: Metrics) -> None:
        self.id, self.metrics, self.opened = session_id, metrics, time.monotonic()
        self.reason: str | None = None
        self.active = 0
        event("session.open", session=session_id, model=model)

    def saw(self, ev: dict) -> None:
        kind = ev.get("type")
        if kind == "response.created":
            self.active += 1
            self.metrics.active_responses += 1
        elif kind == "response.done" and self.active:
            self.active -= 1
            self.metrics.active_responses -= 1
        elif kind == "error":
            err = ev.get("error") or {}
            if err.get("code") == "session_expired":
                self.reason = "expired"
            event("client_error", logging.WARNING, session=self.id, code=err.get("code"),
                  detail=err.get("message"), client_event=err.get("event_id"))

    def closed(self, close_code: int | None) -> None:
        self.metrics.active_responses -= self.active  # responses cut off with the socket
        self.active = 0
        reason = self.reason or CLOSE_REASONS.get(close_code or 1006, "other")
        event("session.close", session=self.id, seconds=round(time.monotonic() - self.opened, 1),
              reason=reason, code=close_code)
