"""The browser demo's static files, served by the real server on loopback: the page and every file it
references, JS syntax (node --check), and the pure helpers of web/audio.js run in Node against numpy and
against the server (the exact session.update the page sends must be accepted)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from models.registry import build_pipeline
from realtime.server import ServerConfig
from tests.realtime_server import SERVER_EVENT, running

WEB = Path(__file__).resolve().parents[1] / "web"
NODE = shutil.which("node")
KEY = "web-test-key"
IDS = {"call", "talk", "status", "error", "notice", "transcript", "voice", "apikey", "remember", "mode", "ttfa",
       "instructions", "threshold", "prefix", "silence", "level", "speaking", "events", "message", "send",
       "transcribe"}
CONTROLS = {"input", "select", "textarea", "meter"}
JS_TYPES = {"text/javascript", "application/javascript"}
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")


class Page(HTMLParser):
    def __init__(self, html: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[str] = []
        self.options: dict[str, list[str]] = {}
        self.label_for: set[str] = set()
        self.controls: list[dict[str, str | None]] = []  # form controls, with their tag
        self._select: str | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "label" and a.get("for"):
            self.label_for.add(a["for"])
        if tag in CONTROLS:
            self.controls.append({"tag": tag, **a})
        if tag == "select":
            self._select = a.get("id")
        if tag == "option" and self._select:
            self.options.setdefault(self._select, []).append(a["value"])
        self.refs += [a[k] for k in ("src", "href") if a.get(k) and not a[k].startswith("data:")]

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


@pytest.fixture(scope="module")
def base():
    with build_pipeline("tiny") as pipeline, running(pipeline, ServerConfig(api_key=KEY)) as (url, _):
        yield url.removesuffix("/v1")


async def _get(url: str, headers: dict | None = None) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as r:
        return r.status, r.content_type, await r.read()


def get(url: str, headers: dict | None = None) -> tuple[int, str, bytes]:
    return asyncio.run(_get(url, headers))


def node(script: str) -> dict:
    """Run `script` in Node with `audio` = require('web/audio.js'); it prints one JSON object."""
    prelude = f"const audio = require({json.dumps(str(WEB / 'audio.js'))});\n"
    out = subprocess.run([NODE, "-e", prelude + script], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


def static_refs(page: Page) -> set[str]:
    """/static/ files the page names, and those its scripts load (the AudioWorklet module)."""
    refs = {r for r in page.refs if r.startswith("/static/")}
    for js in WEB.glob("*.js"):
        refs |= set(re.findall(r"/static/[\w./-]+", js.read_text()))
    return refs


def test_index_page(base):
    status, ctype, body = get(base + "/")
    assert status == 200 and ctype == "text/html"
    page = Page(body.decode())
    assert page.ids >= IDS, f"missing element ids: {IDS - page.ids}"
    assert "voice" not in page.options  # no voices in the page: app.js fills them from /v1/models
    assert "'/v1/models'" in (WEB / "app.js").read_text()
    assert page.options["mode"] == ["server_vad", "ptt"]
    app = (WEB / "app.js").read_text()
    assert all(f"'{i}'" in app for i in IDS), "app.js looks up every element by id"
    # every control has a visible label tied to it, or an aria-label: screen readers (and tests) find it by name
    unlabelled = [c for c in page.controls if c.get("id") not in page.label_for and not c.get("aria-label")]
    assert not unlabelled, unlabelled
    assert {c["id"] for c in page.controls} >= {"instructions", "threshold", "prefix", "silence", "message", "apikey"}
    # everything is local: no CDN, no other origin
    assert all(r.startswith("/static/") for r in page.refs), page.refs
    for f in WEB.iterdir():
        assert not re.search(r"(https?:)?//[\w-]+\.[\w.-]+/", f.read_text()), f"{f.name} names another origin"


def test_static_files_served(base):
    _, _, body = get(base + "/")
    refs = static_refs(Page(body.decode()))
    assert {"/static/app.js", "/static/audio.js", "/static/style.css", "/static/mic-worklet.js"} <= refs
    for ref in sorted(refs):
        status, ctype, data = get(base + ref)
        assert status == 200, ref
        assert ctype in (JS_TYPES if ref.endswith(".js") else {"text/css"}), (ref, ctype)
        assert data == (WEB / ref.removeprefix("/static/")).read_bytes()
    assert get(base + "/static/missing.js")[0] == 404


@needs_node
@pytest.mark.parametrize("name", sorted(p.name for p in WEB.glob("*.js")))
def test_js_parses(name):
    r = subprocess.run([NODE, "--check", str(WEB / name)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


@needs_node
def test_pcm16_helpers_match_numpy():
    x = np.array([0, 0.5, -0.5, 1, -1, 1.5, -2, 1e-5, -0.25, 0.999], dtype=np.float32)
    raw = (np.arange(-32768, 32768, 97, dtype=np.int16)).astype("<i2")
    out = node(f"""
        const enc = audio.floatToPcm16Base64(Float32Array.from({json.dumps(x.tolist())}));
        const dec = Array.from(audio.base64ToFloat({json.dumps(base64.b64encode(raw.tobytes()).decode())}));
        console.log(JSON.stringify({{enc, dec}}));""")
    expected = np.floor(np.clip(x.astype(np.float64), -1, 1) * 32767 + 0.5).astype("<i2").tobytes()  # Math.round
    assert base64.b64decode(out["enc"]) == expected  # little-endian PCM16
    np.testing.assert_array_equal(np.array(out["dec"], dtype=np.float32), raw.astype(np.float32) / 32768)


@needs_node
@pytest.mark.parametrize("rate", [48000, 44100, 16000, 24000])
def test_resampler_streams_to_24k(rate):
    """One second of a 440 Hz tone, fed in 512-sample worklet blocks: 24000 samples at 440 Hz, no clicks."""
    out = node(f"""
        const r = audio.makeResampler({rate}, audio.RATE), y = [];
        for (let s = 0; s < {rate}; s += 512) {{
          const n = Math.min(512, {rate} - s);
          y.push(...r(Float32Array.from({{length: n}}, (_, i) => Math.sin(2 * Math.PI * 440 * (s + i) / {rate}))));
        }}
        console.log(JSON.stringify({{y}}));""")
    y = np.array(out["y"])
    assert abs(len(y) - 24000) <= 2
    t = np.arange(len(y)) / 24000
    np.testing.assert_allclose(y, np.sin(2 * np.pi * 440 * t), atol=0.02)


@needs_node
def test_session_update_accepted_by_server(base):
    """The page's own session.update (both turn modes, for the model /v1/models describes) and audio chunks,
    through the key subprotocol."""
    status, _, body = get(base + "/v1/models", {"Authorization": f"Bearer {KEY}"})
    assert status == 200
    model = json.loads(body)["data"][0]
    first, second = model["capabilities"]["voices"][1:3]
    out = node(f"""
        const tone = Float32Array.from({{length: 1200}}, (_, i) => 0.3 * Math.sin(i / 5));
        const base = {{instructions: 'Be brief.', threshold: 0.7, prefixPaddingMs: 200, silenceMs: 800,
                       model: {json.dumps(model)}}};
        console.log(JSON.stringify({{ptt: audio.sessionUpdate({{...base, voice: '{first}', pushToTalk: true,
                                                                transcribe: false}}),
                                    vad: audio.sessionUpdate({{...base, voice: '{second}', pushToTalk: false,
                                                                transcribe: true}}),
                                    chunk: audio.floatToPcm16Base64(tone)}}));""")

    async def talk() -> None:
        url = base.replace("http", "ws", 1) + f"/v1/realtime?model={model['id']}"
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as denied:
                await http.ws_connect(url, protocols=("realtime", "openai-insecure-api-key.wrong"))
            assert denied.value.status == 401
            async with http.ws_connect(url, protocols=("realtime", f"openai-insecure-api-key.{KEY}")) as ws:
                assert ws.protocol == "realtime"

                async def recv() -> dict:
                    event = await asyncio.wait_for(ws.receive_json(), 10)
                    SERVER_EVENT.validate_python(event)
                    return event

                assert (await recv())["type"] == "session.created"
                for mode, voice, detection in (("vad", second, "server_vad"), ("ptt", first, None)):
                    await ws.send_json(out[mode])
                    updated = await recv()
                    assert updated["type"] == "session.updated", updated
                    cfg = updated["session"]["audio"]
                    assert (cfg["input"]["turn_detection"] or {}).get("type") == detection
                    transcription = cfg["input"]["transcription"]  # only when the page's box is ticked
                    assert transcription == ({"model": model["id"]} if detection else None), transcription
                    assert cfg["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
                    assert cfg["output"]["voice"] == voice
                    assert updated["session"]["instructions"] == "Be brief."
                    if detection:
                        td = cfg["input"]["turn_detection"]
                        assert (td["threshold"], td["prefix_padding_ms"], td["silence_duration_ms"]) == (0.7, 200, 800)
                for _ in range(3):  # push-to-talk now: no VAD events in between
                    await ws.send_json({"type": "input_audio_buffer.append", "audio": out["chunk"]})
                await ws.send_json({"type": "input_audio_buffer.clear"})
                assert (await recv())["type"] == "input_audio_buffer.cleared"  # no error before it

    asyncio.run(talk())


@needs_node
def test_median_and_backoff():
    out = node("""console.log(JSON.stringify({
        m: [[], [5], [3, 1], [9, 1, 5], [4, 1, 3, 2]].map(audio.median),
        b: [0, 1, 2, 3, 4, 5, 10].map(audio.backoffMs)}));""")
    assert out["m"] == [None, 5, 2, 5, 3]
    assert out["b"] == [500, 1000, 2000, 4000, 8000, 8000, 8000]  # capped: a restarted server is found within 8 s


@needs_node
def test_number_fields_send_what_they_show():
    """The page writes fieldNumber's result back into the field, so what is shown is what is sent."""
    out = node("""const silence = {min: 100, max: 5000, step: 50}, prefix = {min: 0, max: 2000, step: 50};
        console.log(JSON.stringify([['50', silence], ['99999', silence], ['777', silence], ['', silence],
          ['abc', silence], ['-5', prefix], ['2000', prefix], ['1999', prefix], ['300', prefix]]
          .map(([t, r]) => audio.fieldNumber(t, r, 'fallback'))));""")
    assert out == [100, 5000, 800, "fallback", "fallback", 0, 2000, 2000, 300]
