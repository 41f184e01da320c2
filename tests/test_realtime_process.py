"""The gateway as its own process (`omni-realtime serve`): SIGTERM with a client that does not read, header bytes
that are not UTF-8, and an API key that must never reach the log."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import websockets

from tests.raw_ws import connect

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def serve(log: Path, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "realtime.cli", "serve", "--model", "tiny", "--port", str(port),
                                 "--threads", "1", "--drain-seconds", "0"], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_sigterm_with_a_client_that_does_not_read_exits_within_5_s(tmp_path):
    log = tmp_path / "server.log"
    with serve(log) as (proc, port):

        async def go():
            stuck = await connect(port, rcvbuf=4096)
            assert stuck.status == 101
            for _ in range(500):  # ~8 MB of session.updated that this client never reads
                await stuck.send_event({"type": "session.update", "session": {"instructions": "x" * 16384}})
            readers = [await websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime") for _ in range(3)]
            for ws in readers:
                assert json.loads(await ws.recv())["type"] == "session.created"
            await asyncio.sleep(1.0)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = await asyncio.to_thread(proc.wait, 10)
            elapsed = time.monotonic() - start
            codes = []
            for ws in readers:
                try:
                    while True:
                        await asyncio.wait_for(ws.recv(), 5)
                except websockets.ConnectionClosed as closed:
                    codes.append(closed.rcvd.code if closed.rcvd else None)
            stuck.close()
            return rc, elapsed, codes

        rc, elapsed, codes = asyncio.run(go())
    print(f"SIGTERM: exit {rc} after {elapsed:.2f} s; readers closed with {codes}")
    assert rc == 0 and elapsed < 5 and codes == [1001, 1001, 1001], log.read_text()[-3000:]


def test_header_bytes_and_the_key_stay_out_of_errors_and_logs(tmp_path):
    key = "sk-test-" + secrets.token_hex(12)
    log = tmp_path / "server.log"
    with serve(log, {"OMNI_REALTIME_API_KEY": key}) as (proc, port):

        async def go():
            refused = [[b"Authorization: Bearer \xff\xfe\xc3"], [b"Authorization: \xc3("],
                       [b"Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.\xff\xfe"],
                       [b"Sec-WebSocket-Protocol: openai-insecure-api-key.wrong"],
                       [b"Authorization: Bearer " + key.encode() + b"\xff"]]
            for headers in refused:
                raw = await connect(port, headers)
                assert raw.status == 401 and "invalid_api_key" in raw.headers, raw.headers
                raw.close()
            # only the key subprotocol, no "realtime": accepted, and aiohttp's warning must not print the key
            raw = await connect(port, [f"Sec-WebSocket-Protocol: openai-insecure-api-key.{key}".encode()])
            assert raw.status == 101
            assert (await raw.recv_event())["type"] == "session.created"
            raw.close()
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime", origin="https://evil.example",
                                          additional_headers={"Authorization": f"Bearer {key}"}) as ws:
                assert json.loads(await ws.recv())["type"] == "session.created"  # the key is the gate

        asyncio.run(go())
        open_health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/health"))
        request = urllib.request.Request(f"http://127.0.0.1:{port}/health", headers={"Authorization": f"Bearer {key}"})
        keyed_health = json.load(urllib.request.urlopen(request))
        assert key not in Path(f"/proc/{proc.pid}/cmdline").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    text = log.read_text()
    assert open_health == {"status": "ok"} and keyed_health["sessions"] == 0 and "last_error" in keyed_health
    assert keyed_health["capacity"]["sessions"] > 0 and keyed_health["capacity"]["thinker_tokens"] > 0
    assert "<redacted>" in text  # the warning that used to carry the key was logged, scrubbed
    assert key not in text and "Traceback" not in text, text[-3000:]
