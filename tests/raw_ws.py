"""A bare WebSocket client over asyncio streams, for the attacks a well-behaved library will not make: any header
bytes, a tiny receive buffer, a client that stops reading, hand-made compressed frames."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import zlib
from dataclasses import dataclass

import numpy as np


@dataclass
class RawSocket:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int
    headers: str

    async def send(self, payload: bytes | str, opcode: int = 1, deflate: bool = False) -> None:
        self.writer.write(frame(payload.encode() if isinstance(payload, str) else payload, opcode, deflate))
        await self.writer.drain()

    async def send_event(self, event: dict) -> None:
        await self.send(json.dumps(event))

    async def recv(self) -> tuple[int, bytes]:
        """(opcode, payload) of the next server frame (unfragmented, unmasked, uncompressed)."""
        head = await self.reader.readexactly(2)
        n = head[1] & 0x7F
        if n == 126:
            n = int.from_bytes(await self.reader.readexactly(2), "big")
        elif n == 127:
            n = int.from_bytes(await self.reader.readexactly(8), "big")
        return head[0] & 0x0F, await self.reader.readexactly(n)

    async def recv_event(self) -> dict:
        while True:
            opcode, payload = await self.recv()
            if opcode == 1:
                return json.loads(payload)
            if opcode == 8:
                raise ConnectionError(f"closed with {int.from_bytes(payload[:2], 'big')}")

    def close(self) -> None:
        self.writer.transport.abort()


def frame(payload: bytes, opcode: int = 1, deflate: bool = False) -> bytes:
    """One masked client frame; `deflate` compresses it as permessage-deflate does (RSV1 set)."""
    if deflate:
        z = zlib.compressobj(9, zlib.DEFLATED, -15)
        payload = (z.compress(payload) + z.flush(zlib.Z_SYNC_FLUSH))[:-4]
    head = bytes([0x80 | (0x40 if deflate else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    mask = os.urandom(4)
    masked = np.frombuffer(payload, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), n)
    return head + mask + masked.tobytes()


async def connect(port: int, headers: list[bytes] = (), path: str = "/v1/realtime", rcvbuf: int | None = None,
                  deflate: bool = False, host: str | None = None) -> RawSocket:
    """Open the socket and send the upgrade request with these raw header lines; reads the response head."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**16)
    host_line = f"Host: {host or f'127.0.0.1:{port}'}".encode("latin-1")  # latin-1: any bytes
    lines = [f"GET {path} HTTP/1.1".encode(), host_line, b"Upgrade: websocket", b"Connection: Upgrade",
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", b"Sec-WebSocket-Version: 13"]
    if deflate:
        lines.append(b"Sec-WebSocket-Extensions: permessage-deflate; client_no_context_takeover")
    writer.write(b"\r\n".join([*lines, *headers]) + b"\r\n\r\n")
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status = int(head.split()[1])
    if status != 101:  # read the body so the caller can see it
        length = next((int(h.split(":")[1]) for h in head.split("\r\n") if h.lower().startswith("content-length")), 0)
        head += (await reader.readexactly(length)).decode("latin-1") if length else ""
    return RawSocket(reader, writer, status, head)
