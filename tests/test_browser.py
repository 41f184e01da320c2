"""The browser demo end to end: real headless Chromium (Debian's `chromium`, driven by playwright) whose fake
microphone plays a WAV of synthetic speech, talking to the real server on loopback with the tiny model.
Controls are found by their labels and roles, as a screen reader finds them. Screenshots at 1366x768 and
390x844 go to .pytest_cache/screenshots/ (the path is printed).

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.turn_corpus import speak
from models.registry import build_pipeline
from realtime.pcm import resample
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import running

try:
    from playwright.sync_api import BrowserContext, Page, Playwright, sync_playwright
    from playwright.sync_api import TimeoutError as PageTimeout
except ImportError:  # checked in the `chromium` fixture
    sync_playwright, PageTimeout = None, TimeoutError

LIMITS = Limits(max_text_tokens=8, max_frames=8, transcription_tokens=8)
SHOTS = Path(__file__).resolve().parents[1] / ".pytest_cache" / "screenshots"
DESKTOP, PHONE = {"width": 1366, "height": 768}, {"width": 390, "height": 844}
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


@dataclass
class Chromium:
    exe: str
    driver: Playwright  # playwright's driver process, started once per module (~1 s); each test its own Chromium


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    exe = shutil.which("chromium") or "/usr/bin/chromium"
    if sync_playwright is None:
        _missing("playwright is not installed (pip install -e '.[test]')")
    if not os.access(exe, os.X_OK):
        _missing("Chromium is not installed (apt-get install chromium)")
    driver = sync_playwright().start()
    try:
        yield Chromium(exe, driver)
    finally:
        driver.stop()


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 s of silence, a spoken question (espeak-ng, ~1.5 s), then 20 s of silence, so Chromium's looping of the
    file never starts a second turn within a test."""
    return write_wav(tmp_path_factory.mktemp("mic") / "speech.wav", _spoken(1.0, "How are you today?", 20.0), 48000)


def _spoken(lead_s: float, text: str, tail_s: float) -> np.ndarray:
    """espeak-ng speech at 48 kHz between silences (Silero VAD adapts to a synthetic buzz within a stream)."""
    speech = resample(torch.from_numpy(speak(text)), 16000, 48000).numpy()
    return np.concatenate([np.zeros(round(lead_s * 48000), np.float32), speech,
                           np.zeros(round(tail_s * 48000), np.float32)])


def write_wav(path: Path, audio: np.ndarray, sr: int) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def two_turns_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A question at 1 s, then 3 s after it ends another: the second talks over the first reply."""
    audio = np.concatenate([_spoken(1.0, "What is the weather like today?", 3.0),
                            _spoken(0.0, "Wait, tell me about Paris instead.", 40.0)])
    return write_wav(tmp_path_factory.mktemp("mic2") / "two.wav", audio, 48000)


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

    def button(self, name: str):
        return self.page.get_by_role("button", name=name, exact=True)

    def wait_state(self, state: str) -> None:
        self.wait(f"document.body.dataset.state === '{state}'", f"the page reached state {state!r}")

    def sent_of(self, kind: str) -> list[dict]:
        return [e for e in self.sent if e["type"] == kind]

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        print(f"screenshot: {path}")
        return path

    def check_layout(self) -> None:
        """The newest message's last line is in view, inside the window; no text overflows its bubble."""
        box = self.page.evaluate("""() => {
          const t = document.getElementById('transcript'), last = t.lastElementChild.getBoundingClientRect();
          const r = t.getBoundingClientRect();
          const wide = [...t.querySelectorAll('.turn')].filter(b => b.scrollWidth > b.clientWidth + 1
                         || b.getBoundingClientRect().right > r.right + 1).length;
          return {last: last.bottom, bottom: r.bottom, height: r.height, win: innerHeight, wide,
                  page: document.documentElement.scrollWidth, width: innerWidth};
        }""")
        assert box["last"] <= box["bottom"] + 1 and box["bottom"] <= box["win"] + 1, box
        assert box["wide"] == 0 and box["page"] <= box["width"], box  # long tokens wrap; no sideways scroll

    def state(self) -> dict:
        return self.page.evaluate("({demo: window.demo, probe: window.probe, state: document.body.dataset.state})")

    def wait(self, condition: str, what: str) -> None:
        try:
            self.page.wait_for_function(condition, timeout=TIMEOUT_MS)
        except PageTimeout as e:
            raise AssertionError(f"{what} within {TIMEOUT_MS} ms; page: {self.state()}") from e


@contextmanager
def browse(chromium: Chromium, wav: Path, profile: Path, viewport: dict = DESKTOP,
           flags: tuple = ()) -> Iterator[Browser]:
    """A fresh Chromium (its own process and profile) and one page (not yet opened)."""
    context = chromium.driver.chromium.launch_persistent_context(
        profile, executable_path=chromium.exe, headless=True, viewport=viewport,
        args=[*FLAGS, *flags, f"--use-file-for-fake-audio-capture={wav}"])
    try:
        yield Browser(context)
    finally:
        context.close()


@contextmanager
def serve_and_browse(pipeline, cfg: ServerConfig, chromium: Chromium, wav: Path, profile: Path,
                     viewport: dict = DESKTOP) -> Iterator[Browser]:
    """The server, and a fresh Chromium on its demo page; the browser closes first, always (an open socket
    would hold up the server's shutdown)."""
    with running(pipeline, cfg) as (url, _), browse(chromium, wav, profile, viewport) as b:
        b.page.goto(url.removesuffix("/v1") + "/")
        assert b.page.locator("#notice").is_hidden()  # a secure context: no HTTPS notice
        yield b


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


def test_server_vad_turn_with_settings_log_meter_and_latency(pipeline, chromium: Chromium, wav: Path, tmp_path: Path):
    """Hands-free, with instructions and VAD settings chosen first: the page sends them, hears the fake mic,
    shows the turn in the event log, meter and latency readout, and plays the reply; changes apply live."""
    t0 = time.monotonic()
    with serve_and_browse(pipeline, ServerConfig(limits=LIMITS), chromium, wav, tmp_path / "profile") as browser:
        page = browser.page
        assert page.get_by_label("Turn taking").input_value() == "server_vad"
        page.get_by_label("Instructions").fill("Answer in one word.")
        page.get_by_label("VAD threshold").fill("0.65")
        page.get_by_label("Prefix padding (ms)").fill("200")
        page.get_by_label("Silence duration (ms)").fill("700")
        spec = pipeline.spec  # the page's voices and model id come from the server's /v1/models
        browser.wait("document.querySelectorAll('#voice option').length > 0", "the voices from /v1/models")
        voices = page.locator("#voice option").evaluate_all("options => options.map(o => o.value)")
        voice = page.get_by_label("Voice", exact=True)  # not the read-aloud box's "Text to speak in this voice"
        assert voices == list(spec.voices) and voice.input_value() == spec.default_voice
        assert page.locator("#model-id").text_content() == spec.name
        other = next(v for v in spec.voices if v != spec.default_voice)
        page.get_by_label("Voice", exact=True).select_option(other)
        page.locator("#transcribe").check()  # transcription is opt-in; asked for, it names the served model
        browser.button("Connect").click()
        browser.wait_state("ready")
        first = browser.sent_of("session.update")[0]["session"]
        assert first["audio"]["output"]["voice"] == other
        assert first["audio"]["input"]["transcription"]["model"] == spec.name
        td = first["audio"]["input"]["turn_detection"]
        assert first["instructions"] == "Answer in one word.", first
        assert td == {"type": "server_vad", "threshold": 0.65, "prefix_padding_ms": 200, "silence_duration_ms": 700}
        s = check_turn(browser, detected=True)
        states = s["probe"]["states"]
        assert is_subsequence(["idle", "connecting", "ready", "user", "thinking", "assistant", "ready"], states), states
        browser.wait("window.probe.sources.every(s => s.endedAt !== null)", "playback of the reply finished")
        for src in browser.state()["probe"]["sources"]:
            assert src["endedAt"] >= src["when"] + src["length"] / src["rate"] - 0.05, src

        demo = browser.state()["demo"]
        assert demo["levelMax"] > 0.3 and demo["outputActive"], demo  # the meter moved; the output light lit
        ms = demo["ttfa"][0]
        assert page.get_by_label("Time to first audio").text_content() == \
            f"first audio {ms} ms · median {ms} ms (1 turn)"
        assert page.locator(".turn.user .who").first.text_content() == "You"
        assert page.locator(".turn.assistant .who").first.text_content() == "Assistant"

        page.get_by_text("Event log").click()
        log = page.get_by_label("Event log")
        rows = log.locator("li")
        types = [(r.get_attribute("data-dir"), r.locator("code").text_content()) for r in rows.all()]
        for expected in [("client", "session.update"), ("client", "input_audio_buffer.append"),
                         ("server", "input_audio_buffer.speech_started"), ("server", "response.output_audio.delta"),
                         ("server", "response.done")]:
            assert expected in types, (expected, types)
        times = [float(t.removesuffix(" s")) for t in log.locator("time").all_text_contents()]
        assert times == sorted(times) and times[-1] > 0, times
        delta_rows = log.locator('li[data-type="response.output_audio.delta"]')
        counts = [int(c) for c in delta_rows.evaluate_all("rows => rows.map(r => r.dataset.count)")]
        received = sum(e["type"] == "response.output_audio.delta" for e in browser.received)
        assert sum(counts) == received and len(counts) < received, (counts, received)  # a stream folds, counted

        page.get_by_label("Instructions").fill("Now answer in French.")
        page.get_by_label("Silence duration (ms)").fill("900")
        page.get_by_label("Silence duration (ms)").press("Tab")  # change events fire on leaving a field
        browser.wait("window.demo.events.filter(t => t === 'session.updated').length >= 3", "two more updates")
        last = browser.sent_of("session.update")[-1]["session"]
        assert last["instructions"] == "Now answer in French."
        assert last["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 900
        assert browser.state()["demo"]["errors"] == []
        browser.check_layout()
        browser.shot("desktop-1366x768-vad-turn")

        browser.button("Hang up").click()
        assert page.eval_on_selector("body", "e => e.dataset.state") == "idle"
        assert browser.button("Connect").is_visible()
    print(f"server VAD turn in the browser: {time.monotonic() - t0:.1f} s")


def test_push_to_talk_with_a_remembered_api_key(pipeline, chromium: Chromium, wav: Path, tmp_path: Path):
    """Push-to-talk through the key subprotocol: a wrong key is refused and said so; the right one, remembered,
    holds a turn and is filled in again after a reload."""
    t0 = time.monotonic()
    cfg = ServerConfig(api_key=KEY, limits=LIMITS)
    with serve_and_browse(pipeline, cfg, chromium, wav, tmp_path / "profile") as browser:
        page = browser.page
        page.get_by_label("Turn taking").select_option("ptt")
        page.get_by_label("API key").fill("wrong-key")
        browser.button("Connect").click()
        browser.wait("window.demo.errors.length > 0 && document.body.dataset.state === 'idle'", "a refusal")
        assert browser.state()["demo"]["errors"] == ["The server refused the API key: check it, then connect again."]
        assert page.locator("#voice option").count() == 0  # /v1/models refused the key too
        page.evaluate("window.demo.errors.length = 0")

        page.get_by_label("API key").fill(KEY)
        page.get_by_label("Remember key in this browser").check()
        browser.button("Connect").click()
        browser.wait_state("ready")
        assert page.locator("#voice option").count() == len(pipeline.spec.voices)  # with the key, the voices came
        talk = browser.button("Hold to talk")
        talk.hover()
        page.mouse.down()
        browser.wait_state("user")
        page.wait_for_timeout(1500)
        page.mouse.up()
        s = check_turn(browser, detected=False)
        assert is_subsequence(["connecting", "ready", "user", "thinking", "assistant", "ready"], s["probe"]["states"])
        sent = [e["type"] for e in browser.sent]
        assert sent.index("input_audio_buffer.commit") < sent.index("response.create"), sent
        assert browser.sent_of("session.update")[0]["session"]["audio"]["input"]["turn_detection"] is None
        held = sum(len(base64.b64decode(e["audio"])) // 2 for e in browser.sent_of("input_audio_buffer.append")) / 24000
        assert 1.0 <= held <= 3.0, f"{held:.2f} s of audio sent for a 1.5 s press"

        browser.button("Hang up").click()
        page.reload()
        assert page.get_by_label("API key").input_value() == KEY
        assert page.get_by_label("Remember key in this browser").is_checked()
        page.get_by_label("Remember key in this browser").uncheck()
        assert page.evaluate("localStorage.length") == 0
    print(f"push-to-talk turn in the browser: {time.monotonic() - t0:.1f} s")


def test_reconnects_by_itself_after_a_server_restart(pipeline, chromium: Chromium, wav: Path, tmp_path: Path):
    t0 = time.monotonic()
    cfg = ServerConfig(limits=LIMITS)
    with browse(chromium, wav, tmp_path / "profile") as browser:
        page = browser.page
        with running(pipeline, cfg) as (url, _):
            port = int(url.removesuffix("/v1").rsplit(":", 1)[1])
            page.goto(url.removesuffix("/v1") + "/")
            page.get_by_label("Turn taking").select_option("ptt")
            browser.button("Connect").click()
            browser.wait_state("ready")
        browser.wait_state("reconnecting")  # the server went away; the page says what it does
        assert "reconnecting in" in page.locator("#status").text_content()
        assert browser.button("Hang up").is_visible()  # and the user can stop it
        # after a failed handshake the page asks the server over HTTP whether the key was at fault; hold that
        # question until the server is back, as when it comes back between the two (CI met this once)
        held: list = []
        page.route("**/v1/models", lambda route: held.append(route))
        page.wait_for_timeout(1500)  # a failed attempt while the server is down
        with running(pipeline, cfg, port=port):
            assert held, "the page asked nothing after the failed handshake"
            for route in held:
                route.continue_()
            page.unroute("**/v1/models")
            browser.wait_state("ready")  # without a click, and with no word of a key
            assert browser.state()["demo"]["errors"] == []
            demo = browser.state()["demo"]
            assert demo["connects"] == 2 and demo["events"].count("session.created") == 2, demo
            assert len(browser.sent_of("session.update")) == 2  # the settings were sent again
            browser.button("Hang up").click()
    print(f"reconnect in the browser: {time.monotonic() - t0:.1f} s")


def test_barge_in_cuts_the_bubble_to_what_was_heard(pipeline, chromium: Chromium, two_turns_wav: Path, tmp_path: Path):
    """The second burst of speech talks over the first reply: playback stops, the page truncates the item at
    what it played, and the bubble shows the server's transcript of that part only."""
    t0 = time.monotonic()
    # more text than 50 frames (4 s) can speak: whenever the user cuts in, less was heard than was written
    cfg = ServerConfig(limits=Limits(max_text_tokens=120, max_frames=50, transcription_tokens=4))
    with serve_and_browse(pipeline, cfg, chromium, two_turns_wav, tmp_path / "profile") as browser:
        page = browser.page
        browser.button("Connect").click()
        browser.wait("window.demo.cut.length > 0 || window.demo.errors.length > 0", "a truncated reply")
        browser.wait("window.demo.events.filter(t => t === 'response.done').length >= 2", "the barge-in answered")
        demo = browser.state()["demo"]
        assert demo["errors"] == [], demo
        (cut,) = demo["truncated"]
        item = cut["item_id"]
        full = "".join(e["delta"] for e in browser.received
                       if e["type"] == "response.output_audio_transcript.delta" and e["item_id"] == item)
        retrieved = next(e for e in browser.received if e["type"] == "conversation.item.retrieved")
        heard = retrieved["item"]["content"][0]["transcript"]
        truncated = next(e for e in browser.received if e["type"] == "conversation.item.truncated")
        assert truncated["item_id"] == item and truncated["audio_end_ms"] == cut["audio_end_ms"]
        types = [e["type"] for e in browser.received]
        first_done = types.index("response.done")
        first = browser.received[first_done]["response"]
        barged = [i for i, t in enumerate(types) if t == "input_audio_buffer.speech_started"][1]
        if barged < first_done:  # still generating when the user spoke: the server's VAD cancelled it
            assert first["status"] == "cancelled", first
        else:  # generation had ended (a fast machine) but playback had not: truncation alone cuts it
            assert first["status"] in ("completed", "incomplete"), first
        assert "response.cancel" not in [e["type"] for e in browser.sent]
        bubble = page.locator(f'.turn.assistant[data-item="{item}"]')
        assert bubble.locator(".text").text_content() == heard
        assert len(heard) < len(full), (heard, full)  # cut: less than was generated
        assert "interrupted" in bubble.get_attribute("class")
        events = [e for e in browser.state()["demo"]["events"] if "delta" not in e]
        # and the interruption got its own answer (two, when a starved CPU stretches a pause in it past 500 ms)
        assert page.locator(".turn.assistant").count() in (2, 3), events
    print(f"barge-in in the browser: {time.monotonic() - t0:.1f} s (heard {cut['audio_end_ms']} ms)")


def test_insecure_context_says_why_and_text_still_works(pipeline, chromium: Chromium, wav: Path, tmp_path: Path):
    """Opened by a host name that is not localhost over plain HTTP: no microphone, and the page says why;
    a typed message (Enter) is answered. On a phone-sized screen."""
    t0 = time.monotonic()
    flags = ("--host-resolver-rules=MAP omni-demo.test 127.0.0.1",)
    # a keyless server answers only hosts it knows (no DNS rebinding): this one is allowed by name
    cfg = ServerConfig(limits=LIMITS, allowed_origins=("http://omni-demo.test",))
    with running(pipeline, cfg) as (url, _), browse(chromium, wav, tmp_path / "profile", PHONE, flags) as browser:
        page = browser.page
        page.goto(url.removesuffix("/v1").replace("127.0.0.1", "omni-demo.test") + "/")
        assert page.evaluate("window.isSecureContext") is False
        notice = page.get_by_role("note")
        assert notice.is_visible() and "needs HTTPS or localhost" in notice.text_content()
        browser.button("Connect").click()
        browser.wait_state("ready")
        assert browser.button("Hold to talk").is_hidden() and page.locator("#status").text_content() == \
            "Ready: type a message"
        words = "Please answer: " + "x" * 200  # one very long token must wrap inside its bubble
        page.get_by_label("Message").fill(words)
        page.get_by_label("Message").press("Enter")
        browser.wait("window.demo.events.includes('response.done')", "an answer")
        browser.wait_state("ready")
        sent = [e["type"] for e in browser.sent]
        assert sent[-2:] == ["conversation.item.create", "response.create"], sent
        item = browser.sent_of("conversation.item.create")[0]["item"]
        assert item["content"] == [{"type": "input_text", "text": words}]
        demo = browser.state()["demo"]
        assert demo["errors"] == [] and len(demo["ttfa"]) == 1 and "input_audio_buffer.append" not in sent, demo
        assert page.locator(".turn.user .text").text_content() == words
        assert page.locator(".turn.assistant .text").text_content()  # the reply's transcript
        assert page.get_by_label("Message").input_value() == ""
        browser.check_layout()
        browser.shot("phone-390x844-text-message")
    print(f"text message in an insecure context: {time.monotonic() - t0:.1f} s")


def newest_end_in_view(b: Browser) -> dict:
    """Where the end of the newest message is, against the transcript's visible box and the window."""
    return b.page.evaluate("""() => {
      const t = document.getElementById('transcript'), r = t.getBoundingClientRect();
      const last = t.lastElementChild.getBoundingClientRect();
      return {end: last.bottom, top: last.top, boxTop: r.top, boxBottom: r.bottom, win: innerHeight,
              scrolled: document.scrollingElement.scrollTop};
    }""")


def test_phone_keeps_the_newest_reply_in_view_and_shows_what_it_sends(pipeline, chromium: Chromium, wav: Path,
                                                                      tmp_path: Path):
    """At 390x844: after a spoken and then a typed turn the newest message's end is on screen; number fields
    show the value that is sent; one settings panel at a time reaches 'Remember key' and a long event log;
    replies cut by the length limit are marked; transcription is off unless asked for."""
    t0 = time.monotonic()
    cfg = ServerConfig(limits=Limits(max_text_tokens=40, max_frames=12, transcription_tokens=8))
    with serve_and_browse(pipeline, cfg, chromium, wav, tmp_path / "profile", PHONE) as browser:
        page = browser.page
        page.get_by_text("Session settings").click()
        for label, typed, shown in (("Silence duration (ms)", "50", "100"), ("Prefix padding (ms)", "99999", "2000"),
                                    ("Silence duration (ms)", "777", "800")):
            page.get_by_label(label).fill(typed)
            page.get_by_label(label).press("Tab")
            assert page.get_by_label(label).input_value() == shown, label
        remember = page.get_by_label("Remember key in this browser")
        remember.scroll_into_view_if_needed()
        box = remember.bounding_box()
        assert remember.is_visible() and box["y"] >= 0 and box["y"] + box["height"] <= PHONE["height"], box
        browser.button("Connect").click()
        browser.wait_state("ready")
        td = browser.sent_of("session.update")[0]["session"]["audio"]["input"]
        assert (td["turn_detection"]["silence_duration_ms"], td["turn_detection"]["prefix_padding_ms"]) == (800, 2000)
        assert td["transcription"] is None  # costs more than the reply on the tiny model: off by default
        assert page.locator("#transcript").get_attribute("data-hint") == "Speak or type a message."

        browser.wait("window.demo.events.includes('response.done')", "the spoken turn's reply")
        browser.wait_state("ready")
        spoken = newest_end_in_view(browser)
        words = "Tell me more. " * 30
        page.get_by_label("Message").fill(words)
        page.get_by_label("Message").press("Enter")
        browser.wait("window.demo.events.filter(t => t === 'response.done').length >= 2", "the typed turn's reply")
        browser.wait_state("ready")
        typed = newest_end_in_view(browser)
        for where in (spoken, typed):
            assert where["boxTop"] <= where["end"] <= where["boxBottom"] + 1 <= where["win"] + 1, where
            assert where["scrolled"] == 0, where  # the page itself never scrolls: the transcript does
        assert page.locator(".turn").count() == 4 and page.locator(".turn").last.get_attribute("class") == \
            "turn assistant incomplete"
        done = [e for e in browser.received if e["type"] == "response.done"]
        assert done[-1]["response"]["status"] == "incomplete"  # the limits above cut every reply short
        assert page.locator(".turn.assistant").last.get_attribute("data-ended") == \
            "incomplete: cut off (max_output_tokens)"
        browser.shot("phone-390x844-typed-after-spoken")

        page.get_by_text("Event log").click()
        assert page.locator("#settings").evaluate("d => d.open") is False  # one panel at a time on a phone
        rows = page.evaluate("""() => { const l = document.getElementById('events'), r = l.getBoundingClientRect();
          return [...l.children].filter(li => { const b = li.getBoundingClientRect();
            return b.top >= r.top - 1 && b.bottom <= Math.min(r.bottom, innerHeight) + 1; }).length; }""")
        assert rows >= 15, rows
        browser.shot("phone-390x844-event-log")
    print(f"phone layout: {time.monotonic() - t0:.1f} s")
