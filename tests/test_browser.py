"""The browser demo end to end: real headless Chromium (Debian's `chromium`, driven by playwright) whose fake
microphone plays a WAV of synthetic speech, talking to the real server on loopback with the tiny model.

Under CI (CI=true) a missing Chromium or playwright fails these tests; elsewhere they are skipped.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import running
from tests.speech import speech_in_silence

try:
    from playwright.sync_api import BrowserContext, Page, sync_playwright
    from playwright.sync_api import TimeoutError as PageTimeout
except ImportError:  # checked in the `chromium` fixture
    sync_playwright, PageTimeout = None, TimeoutError

LIMITS = Limits(max_text_tokens=8, max_frames=8, transcription_tokens=8)
KEY = "browser-test-key"
TIMEOUT_MS = 60_000  # generous for a loaded 2-core machine; a turn takes about a second here
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
]
# Runs in the page before app.js: records every body[data-state] change and every buffer the page plays.
PROBE = """
window.probe = { states: [], sources: [] };
document.addEventListener('DOMContentLoaded', () => {
  const note = () => {
    const s = document.body.dataset.state, all = window.probe.states;
    if (all[all.length - 1] !== s) all.push(s);
  };
  note();
  new MutationObserver(note).observe(document.body, { attributes: true, attributeFilter: ['data-state'] });
});
const start = AudioBufferSourceNode.prototype.start;
AudioBufferSourceNode.prototype.start = function (when = 0, ...rest) {
  const ctx = this.context, buf = this.buffer, x = buf.getChannelData(0);
  const rec = { when, now: ctx.currentTime, length: buf.length, rate: buf.sampleRate, contextRate: ctx.sampleRate,
                abs: x.reduce((s, v) => s + Math.abs(v), 0), endedAt: null };
  this.addEventListener('ended', () => { rec.endedAt = ctx.currentTime; });
  window.probe.sources.push(rec);
  return start.call(this, when, ...rest);
};
"""


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{what}: required under CI (.ci/run installs it)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = shutil.which("chromium") or "/usr/bin/chromium"
    if sync_playwright is None:
        _missing("playwright is not installed (pip install -e '.[test]')")
    if not os.access(exe, os.X_OK):
        _missing("Chromium is not installed (apt-get install chromium)")
    return exe


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 s of near-silence, 1.5 s of speech, then 20 s of near-silence, so Chromium's looping of the file
    never starts a second turn within a test."""
    u = speech_in_silence(lead_s=1.0, speech_s=1.5, tail_s=20.0, sr=48000)
    path = tmp_path_factory.mktemp("mic") / "speech.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(u.sr)
        w.writeframes((np.clip(u.audio, -1, 1) * 32767).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline("tiny") as p:
        yield p


class Browser:
    """One page of a fresh Chromium profile; what the server sent it, as decoded JSON, in `received`."""

    def __init__(self, context: BrowserContext) -> None:
        self.page: Page = context.new_page()
        self.received: list[dict] = []
        self.sent: list[dict] = []
        self.page_errors: list[str] = []
        self.page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        self.page.on("websocket", self._watch)
        self.page.add_init_script(PROBE)

    def _watch(self, ws) -> None:
        ws.on("framereceived", lambda payload: self.received.append(json.loads(payload)))
        ws.on("framesent", lambda payload: self.sent.append(json.loads(payload)))

    def state(self) -> dict:
        return self.page.evaluate("({demo: window.demo, probe: window.probe, state: document.body.dataset.state})")

    def wait(self, condition: str, what: str) -> None:
        try:
            self.page.wait_for_function(condition, timeout=TIMEOUT_MS)
        except PageTimeout as e:
            raise AssertionError(f"{what} within {TIMEOUT_MS} ms; page: {self.state()}") from e


@contextmanager
def serve_and_browse(pipeline, cfg: ServerConfig, chromium: str, wav: Path, profile: Path) -> Iterator[Browser]:
    """The server, and a fresh Chromium on its demo page; the browser closes first, always (an open socket
    would hold up the server's shutdown)."""
    with running(pipeline, cfg) as (url, _), sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=chromium, headless=True, args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}"])
        try:
            b = Browser(context)
            b.page.goto(url.removesuffix("/v1") + "/")
            yield b
        finally:
            context.close()


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    it = iter(whole)
    return all(x in it for x in part)


def delta_samples(events: list[dict], response_id: str) -> list[np.ndarray]:
    """The PCM16 of each non-empty audio delta of one response, as floats the way the page decodes them."""
    chunks = (base64.b64decode(e["delta"]) for e in events
              if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id)
    return [np.frombuffer(c, "<i2").astype(np.float64) / 32768 for c in chunks if c]


def check_turn(b: Browser, detected: bool) -> dict:
    """One spoken turn as the page saw it, and the audio it scheduled for playback; returns the page state."""
    b.wait("window.demo.events.includes('response.done') || window.demo.errors.length > 0", "response.done or an error")
    for _ in range(100):  # playwright reports socket frames asynchronously: let them catch up
        if any(e["type"] == "response.done" for e in b.received):
            break
        b.page.wait_for_timeout(50)
    s = b.state()
    events, demo = s["demo"]["events"], s["demo"]
    assert demo["errors"] == [] and b.page_errors == [], s
    turn = ("input_audio_buffer.committed", "response.created", "response.output_audio.delta", "response.done")
    assert all(k in events for k in turn), events
    first = {k: events.index(k) for k in turn}
    assert list(first.values()) == sorted(first.values()), events
    if detected:
        assert "input_audio_buffer.speech_started" in events and "input_audio_buffer.speech_stopped" in events, events
        assert events.index("input_audio_buffer.speech_started") < events.index("input_audio_buffer.speech_stopped")
        assert events.index("input_audio_buffer.speech_stopped") < first["input_audio_buffer.committed"]
    else:
        assert "input_audio_buffer.speech_started" not in events, events
    # the socket carried the same events, in the same order (the page records every one)
    n = min(len(events), len(b.received))
    assert [e["type"] for e in b.received][:n] == events[:n] and n > first["response.done"], (events, b.received)
    done = next(e for e in b.received if e["type"] == "response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done  # incomplete: LIMITS cut it short

    # time to first audio, shown on the assistant's bubble
    item = next(e["item_id"] for e in b.received if e["type"] == "response.output_audio.delta")
    bubble = b.page.locator(f'.turn.assistant[data-item="{item}"]')
    assert len(demo["ttfa"]) == 1, s
    assert bubble.get_attribute("data-ttfa") == f"{demo['ttfa'][0]} ms", s
    assert 0 <= demo["ttfa"][0] < TIMEOUT_MS

    # every audio delta became one AudioBufferSourceNode at 24 kHz, back to back, with the same samples
    chunks = delta_samples(b.received, done["response"]["id"])
    sources = s["probe"]["sources"]
    assert chunks and len(sources) == len(chunks), (len(chunks), sources)
    assert [src["length"] for src in sources] == [len(c) for c in chunks]
    np.testing.assert_allclose([src["abs"] for src in sources], [np.abs(c).sum() for c in chunks], rtol=1e-5)
    assert all(src["rate"] == 24000 for src in sources)
    assert 0 <= sources[0]["when"] - sources[0]["now"] < 0.25, sources[0]  # a little lead, no delay
    for a, b_ in zip(sources, sources[1:], strict=False):  # no overlap: gapless, in order
        assert b_["when"] >= a["when"] + a["length"] / a["rate"] - 1e-6, sources
    return s


def test_server_vad_turn(pipeline, chromium: str, wav: Path, tmp_path: Path) -> None:
    """Hands-free: the fake mic's speech is detected, committed and answered with audio the page plays."""
    t0 = time.monotonic()
    with serve_and_browse(pipeline, ServerConfig(limits=LIMITS), chromium, wav, tmp_path / "profile") as browser:
        page = browser.page
        assert page.eval_on_selector("#mode", "e => e.value") == "server_vad"
        page.click("#talk")
        browser.wait("document.body.dataset.state === 'ready'", "the session became ready")
        s = check_turn(browser, detected=True)
        states = s["probe"]["states"]
        assert is_subsequence(["idle", "connecting", "ready", "user", "thinking", "assistant", "ready"], states), states
        # the AudioContext actually rendered the reply: every buffer ended on its own, no earlier than due
        browser.wait("window.probe.sources.every(s => s.endedAt !== null)", "playback of the reply finished")
        for src in browser.state()["probe"]["sources"]:
            assert src["endedAt"] >= src["when"] + src["length"] / src["rate"] - 0.05, src
        page.click("#talk")  # hang up
        assert page.eval_on_selector("body", "e => e.dataset.state") == "idle"
    print(f"server VAD turn in the browser: {time.monotonic() - t0:.1f} s")


def test_push_to_talk_with_api_key(pipeline, chromium: str, wav: Path, tmp_path: Path) -> None:
    """Push-to-talk through the key subprotocol: a wrong key is refused, the right one holds a turn."""
    t0 = time.monotonic()
    cfg = ServerConfig(api_key=KEY, limits=LIMITS)
    with serve_and_browse(pipeline, cfg, chromium, wav, tmp_path / "profile") as browser:
        page = browser.page
        page.select_option("#mode", "ptt")
        page.fill("#apikey", "wrong-key")
        page.click("#talk")
        browser.wait("window.demo.errors.length > 0 && document.body.dataset.state === 'idle'", "a refusal")
        assert browser.state()["demo"]["errors"] == ["Could not connect: is the server up, and is the API key right?"]
        page.evaluate("window.demo.errors.length = 0")

        page.fill("#apikey", KEY)
        page.click("#talk")
        browser.wait("document.body.dataset.state === 'ready'", "the session became ready")
        assert page.text_content("#talk") == "Hold to talk"
        page.hover("#talk")
        page.mouse.down()
        browser.wait("document.body.dataset.state === 'user'", "the button was held")
        page.wait_for_timeout(1500)
        page.mouse.up()
        s = check_turn(browser, detected=False)
        assert is_subsequence(["connecting", "ready", "user", "thinking", "assistant", "ready"], s["probe"]["states"])
        sent = [e["type"] for e in browser.sent]
        assert sent.index("input_audio_buffer.commit") < sent.index("response.create"), sent
        update = next(e for e in browser.sent if e["type"] == "session.update")
        assert update["session"]["audio"]["input"]["turn_detection"] is None
        held = sum(len(base64.b64decode(e["audio"])) // 2 for e in browser.sent
                   if e["type"] == "input_audio_buffer.append") / 24000
        assert 1.0 <= held <= 3.0, f"{held:.2f} s of audio sent for a 1.5 s press"
    print(f"push-to-talk turn in the browser: {time.monotonic() - t0:.1f} s")
