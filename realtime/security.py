"""Who may use the server: API key, browser Origin and Host checks (README "Security model"); keys kept out of logs."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

KEY_PROTOCOL = "openai-insecure-api-key."
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_SECRET = re.compile(r"(openai-insecure-api-key\.|bearer\s+)[^\s,'\"\])]+", re.IGNORECASE)


def key_matches(given: str, key: str) -> bool:
    """`given` compared as the header's bytes as they came (aiohttp decodes headers as UTF-8 with surrogateescape)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), key.encode())


def _hostname(netloc: str) -> str | None:
    try:
        return urlsplit("//" + netloc).hostname
    except ValueError:
        return None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_NAMES or (_is_ip(host) and ipaddress.ip_address(host).is_loopback)


@dataclass(frozen=True)
class Gate:
    api_key: str | None
    allowed_origins: tuple[str, ...] = ()  # "scheme://host[:port]", or "*" for any
    loopback: bool = True  # the server is bound to a loopback address

    def __post_init__(self) -> None:
        for origin in self.allowed_origins:
            if origin != "*" and (urlsplit(origin).scheme not in ("http", "https") or not _hostname(
                    urlsplit(origin).netloc)):
                raise ValueError(f"allowed origin {origin!r} is not '*' or scheme://host[:port] (http or https)")

    def origin_ok(self, origin: str | None, host: str) -> bool:
        """Without a key: an allowed origin, the server's own host, or localhost if bound to loopback; with one, any."""
        if self.api_key or origin is None or "*" in self.allowed_origins:
            return True
        origin = origin.strip().rstrip("/").lower()
        if origin in (o.lower() for o in self.allowed_origins):
            return True
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        if parts.scheme not in ("http", "https"):
            return False
        return parts.netloc == host.lower() or (self.loopback and parts.hostname in LOOPBACK_NAMES)

    def host_ok(self, host: str) -> bool:
        """Without a key, the Host must be an address, localhost or an allowed origin's host (no DNS rebinding)."""
        if self.api_key or "*" in self.allowed_origins:
            return True
        name = _hostname(host)
        if name is None:
            return False
        return _is_ip(name) or name == "localhost" or name in {_hostname(urlsplit(o).netloc) for o in
                                                                self.allowed_origins}


class RedactKeys(logging.Filter):
    """Rewrites log records that carry an API key (offered subprotocol, Bearer header or the server's key)."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format is left to the handler
            return True
        clean = _SECRET.sub(r"\1<redacted>", text)
        for key in self.keys:
            clean = clean.replace(key, "<redacted>")
        if not clean.isascii():  # undecodable header bytes would break the log handler
            clean = clean.encode("utf-8", "backslashreplace").decode("utf-8")
        if clean != text:
            record.msg, record.args = clean, ()
        return True


REDACT = RedactKeys()


def redact_logs(api_key: str | None) -> None:
    if api_key:
        REDACT.keys.add(api_key)
    for name in ("aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.websocket", "aiohttp.internal",
                 "realtime.server", "realtime.session", "realtime.responding", "realtime.response"):
        logger = logging.getLogger(name)
        if REDACT not in logger.filters:
            logger.addFilter(REDACT)
