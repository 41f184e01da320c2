"""`omni-realtime serve` run as a user runs it (a child process, tiny model) over TLS with a key: the startup
line, structured logs of a session, the tiny model's reply cap, and /metrics parsed by prometheus_client."""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from realtime.cli import TINY_REPLY_FRAMES
from tests.realtime_server import SERVER_EVENT
from tests.serve_process import Served, serve

KEY = "serve-test-key-4f9d"
FAMILIES = {
    "omni_sessions_open": "gauge", "omni_sessions_opened": "counter", "omni_sessions_rejected": "counter",
    "omni_time_to_first_audio_seconds": "histogram", "omni_rtf": "histogram", "omni_errors": "counter",
    "omni_responses_active": "gauge", "omni_kv_blocks_used": "gauge", "omni_kv_blocks_capacity": "gauge",
    "omni_engine_steps": "counter", "omni_engine_busy_seconds": "counter", "omni_responses": "counter",
    # prometheus_client's default collectors: the process and the Python runtime
    "process_cpu_seconds": "counter", "process_virtual_memory_bytes": "gauge", "process_resident_memory_bytes": "gauge",
    "process_start_time_seconds": "gauge", "process_open_fds": "gauge", "process_max_fds": "gauge",
    "python_gc_objects_collected": "counter", "python_gc_objects_uncollectable": "counter",
    "python_gc_collections": "counter", "python_info": "gauge",
    "omni_ready": "gauge", "omni_draining": "gauge", "omni_sessions_max": "gauge", "omni_sessions_free": "gauge",
    "omni_kv_conversations_free": "gauge",  # realtime/readiness.py
    "omni_turns_waiting": "gauge", "omni_turns_waited": "counter", "omni_admission_wait_seconds": "counter",
    "omni_turn_milestone_seconds": "histogram", "omni_commit_input_seconds": "histogram",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (needed to make a test certificate)")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")], check=True, capture_output=True)
    with serve("--api-key", KEY, "--ssl-certfile", str(d / "cert.pem"), "--ssl-keyfile", str(d / "key.pem")) as s:
        yield s


async def recv(ws) -> dict:
    event = await asyncio.wait_for(ws.receive_json(), 60)
    SERVER_EVENT.validate_python(event)
    return event


async def one_session(url: str) -> tuple[str, list[dict]]:
    """Over wss: a refused key, then a session with one bad event and one spoken reply to a text message."""
    ws_url = url.replace("https", "wss", 1) + "v1/realtime?model=qwen3-omni"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as denied:
            await http.ws_connect(ws_url, ssl=False, headers={"Authorization": "Bearer wrong"})
        assert denied.value.status == 401
        async with http.ws_connect(ws_url, ssl=False, headers={"Authorization": f"Bearer {KEY}"}) as ws:
            created = await recv(ws)
            await ws.send_str("{not json")
            assert (await recv(ws))["error"]["code"] == "invalid_json"
            await ws.send_json({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there!"}]}})
            await ws.send_json({"type": "response.create"})
            events = []
            while not events or events[-1]["type"] != "response.done":
                events.append(await recv(ws))
        return created["session"]["id"], events


def test_startup_line(served: Served):
    start = served.wait_for(lambda r: r.get("message") == "serving")
    assert served.url.startswith("https://127.0.0.1:") and served.url.endswith("/"), start
    assert start["model"] == "tiny" and start["device"] == "cpu" and start["api_key"] == "required", start
    assert start["version"] and start["dtype"] == "float32"


def test_session_logs_and_the_tiny_reply_cap(served: Served):
    session_id, events = asyncio.run(one_session(served.url))
    done = events[-1]["response"]
    audio = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] == "response.output_audio.delta")
    assert 0 < audio / 48000 <= TINY_REPLY_FRAMES * 0.08, audio / 48000  # a few seconds, not two minutes

    opened = served.wait_for(lambda r: r.get("message") == "session.open")
    assert opened["session"] == session_id and opened["model"] == "qwen3-omni"
    error = served.wait_for(lambda r: r.get("message") == "client_error")
    assert error["session"] == session_id and error["code"] == "invalid_json" and error["level"] == "warning"
    reply = served.wait_for(lambda r: r.get("message") == "response")
    assert reply["response"] == done["id"] and reply["status"] == done["status"], (reply, done)
    assert reply["audio_s"] == round(audio / 48000, 2) and 0 <= reply["ttfa_ms"] < 60_000, reply
    closed = served.wait_for(lambda r: r.get("message") == "session.close")
    assert closed["session"] == session_id and closed["reason"] == "normal" and closed["seconds"] >= 0, closed
    assert not any(KEY in line for line in served.lines)  # never the key, not even in the access log


def test_metrics_parse_with_prometheus_client(served: Served):
    asyncio.run(one_session(served.url))

    async def get() -> tuple[str, str]:
        async with aiohttp.ClientSession() as http:
            async with http.get(served.url + "metrics", ssl=False) as r:
                assert r.status == 401  # a keyed server shows its metrics only with the key
            auth = {"Authorization": f"Bearer {KEY}"}
            async with http.get(served.url + "metrics", ssl=False, headers=auth) as r:
                return r.headers["Content-Type"], await r.text()

    ctype, text = asyncio.run(get())
    assert ctype.startswith("text/plain; version=0.0.4")
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), names  # each family once
    assert {f.name: f.type for f in families} == FAMILIES, names
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    assert values[("omni_errors_total", (("code", "invalid_json"),))] >= 1
    assert values[("omni_sessions_opened_total", ())] >= 1 and values[("omni_sessions_open", ())] == 0
    assert values[("omni_time_to_first_audio_seconds_count", ())] >= 1
    for milestone in ("admitted", "prompt", "first_text", "first_frame", "first_audio"):  # the engine's, per turn
        assert values[("omni_turn_milestone_seconds_count", (("milestone", milestone),))] >= 1
    assert values[("omni_turn_milestone_seconds_sum", (("milestone", "first_audio"),))] > 0
    assert values[("omni_rtf_count", ())] >= 1 and values[("omni_responses_active", ())] == 0
    assert sum(v for (name, _), v in values.items() if name == "omni_responses_total") >= 1  # responses ended
    assert values[("process_resident_memory_bytes", ())] > 0
    assert values[("omni_kv_blocks_capacity", (("stage", "thinker"),))] > 0
    assert values[("omni_kv_blocks_used", (("stage", "thinker"),))] == 0  # the session has ended
    assert values[("omni_engine_steps_total", (("stage", "talker"),))] > 0
    assert values[("omni_engine_busy_seconds_total", (("stage", "talker"),))] > 0
    assert values[("omni_turns_waiting", ())] == 0  # nothing is left queued once the sessions have ended
