"""The demo page's "Read aloud" box in real headless Chromium: shown when the served model reads text aloud,
it speaks typed text through /v1/audio/speech (with the page's API key) and plays the WAV that comes back;
hidden for a model that does not read aloud."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests import test_browser
from tests.realtime_server import running
from tests.test_browser import TIMEOUT_MS, Chromium, browse

chromium, wav = test_browser.chromium, test_browser.wav  # the chat page tests' fixtures

KEY = "page-key"


@pytest.fixture(scope="module")
def tts():
    pipeline = build_pipeline("tiny-tts")
    with pipeline:
        yield pipeline


def test_read_aloud_speaks_typed_text_in_the_chosen_voice(tts, chromium: Chromium, wav: Path, tmp_path: Path) -> None:
    cfg = ServerConfig(api_key=KEY, data_dir=tmp_path / "data", limits=Limits(max_frames=10))
    with running(tts, cfg) as (url, _), browse(chromium, wav, tmp_path / "profile") as b:
        page = b.page
        page.goto(url.removesuffix("/v1") + "/")
        page.fill("#apikey", KEY)
        page.dispatch_event("#apikey", "change")  # the models list needs the key here
        page.wait_for_selector("#read-aloud:not([hidden])", timeout=TIMEOUT_MS)
        assert page.eval_on_selector("#voice", "s => [...s.options].map(o => o.value)")[:2] == ["vivian", "serena"]
        page.select_option("#voice", "ryan")
        page.eval_on_selector("#read-aloud", "d => { d.open = true; }")
        page.fill("#speak-text", "Hello from the page.")
        page.click("#speak")
        page.wait_for_function("window.demo.spoken.length === 1", timeout=TIMEOUT_MS)
        spoken = page.evaluate("window.demo.spoken[0]")
        assert spoken["type"] == "audio/wav" and spoken["bytes"] > 44 + 2 * 1920
        assert page.eval_on_selector("#speak-audio", "a => !a.hidden && a.src.startsWith('blob:')")
        assert page.text_content("#speak-status") == ""


def test_read_aloud_is_hidden_for_a_model_that_cannot(chromium: Chromium, wav: Path, tmp_path: Path) -> None:
    pipeline = build_pipeline("tiny-thinker")
    with pipeline, running(pipeline, ServerConfig(data_dir=tmp_path / "data")) as (url, _), \
            browse(chromium, wav, tmp_path / "profile") as b:
        b.page.goto(url.removesuffix("/v1") + "/")
        b.page.wait_for_function("document.querySelector('#model-id').textContent !== 'The served model'",
                                 timeout=TIMEOUT_MS)
        assert b.page.locator("#read-aloud").is_hidden()
