"""Turn detection with the real models on real (espeak-ng) speech: Silero's threshold, Smart Turn's early end,
noise, and semantic_vad's fallback without its model file."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest

from benchmarks.turn_corpus import RATE, Utterance, available, pink_noise, scaled, utterance, with_noise
from realtime.smart_turn import ENV, turn_model_path
from realtime.turn_model import SHA256
from realtime.turn_presets import EAGERNESS
from realtime.vad import ServerVad, SpeechStarted, SpeechStopped, VadConfig, VadEvent

pytestmark = pytest.mark.skipif(not available(), reason="needs espeak-ng and sox (.ci/run installs them)")


def _run(cfg: VadConfig, x: np.ndarray, chunk: int = 960) -> tuple[ServerVad, list[VadEvent]]:
    vad = ServerVad(cfg, RATE)
    return vad, [e for i in range(0, len(x), chunk) for e in vad.push(x[i : i + chunk])]


def _one_turn(u: Utterance, cfg: VadConfig) -> tuple[SpeechStarted, SpeechStopped]:
    """The utterance's single turn; asserts it starts inside the speech and stops after its end."""
    _, events = _run(cfg, u.audio)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped], (u.name, events)
    start, stop = events
    assert u.speech_start_s * 1000 - cfg.prefix_padding_ms - 100 <= start.audio_start_ms <= u.speech_start_s * 1000
    assert stop.speech_end_ms >= u.speech_end_s * 1000 - 100 and stop.audio_end_ms > u.speech_end_s * 1000
    return start, stop


def test_threshold_is_a_speech_probability_as_openai_documents() -> None:
    """A higher threshold needs louder audio: a loud utterance opens a turn at 0.3, 0.5 and 0.8; the same one
    50 dB quieter (Silero's probability ~0.4 on it) only at 0.3."""
    loud, quiet = utterance(0, "whole"), scaled(utterance(0, "whole"), -50)
    for threshold in (0.3, 0.5, 0.8):
        _one_turn(loud, VadConfig(threshold=threshold))
    started = {t: any(isinstance(e, SpeechStarted) for e in _run(VadConfig(threshold=t), quiet.audio)[1])
               for t in (0.3, 0.5, 0.8)}
    assert started[0.3] and not started[0.8], started


def test_silence_duration_sets_the_stop() -> None:
    u = utterance(1, "whole")
    stops = [_one_turn(u, VadConfig(silence_duration_ms=ms))[1] for ms in (200, 500, 800)]
    assert [s.speech_end_ms for s in stops] == [stops[0].speech_end_ms] * 3
    # 7, 16 and 25 frames of 32 ms
    assert [b.audio_end_ms - a.audio_end_ms for a, b in zip(stops, stops[1:], strict=False)] == [288, 288]
    assert 200 <= stops[1].audio_end_ms - u.speech_end_s * 1000 <= 700  # 500 ms of silence after the last word


@pytest.fixture
def smart_turn_model() -> None:
    if not turn_model_path().is_file():
        pytest.fail(f"Smart Turn model missing at {turn_model_path()}: `make` fetches it")


@pytest.mark.usefixtures("smart_turn_model")
def test_model_file_is_the_pinned_one() -> None:
    assert hashlib.sha256(turn_model_path().read_bytes()).hexdigest() == SHA256


@pytest.mark.usefixtures("smart_turn_model")
@pytest.mark.parametrize("sentence", [0, 1])
def test_smart_turn_ends_a_finished_sentence_sooner_than_a_cut_one(sentence: int) -> None:
    """Sentence 0 is cut before "when ...", sentence 1 at a comma; server_vad treats both alike."""
    cfg = VadConfig.from_config({"type": "semantic_vad", "eagerness": "auto"})
    assert ServerVad(cfg, RATE).semantic
    auto = EAGERNESS["auto"]
    waits = {}
    for kind in ("whole", "cut"):
        u = utterance(sentence, kind, tail_ms=2000)
        waits[kind] = _one_turn(u, cfg)[1].audio_end_ms - u.speech_end_s * 1000
    assert waits["whole"] <= auto.candidate_ms + 200, waits  # ended at Smart Turn's first look
    assert waits["cut"] >= auto.max_silence_ms - 100, waits  # waited for the most silence


@pytest.mark.parametrize("snr_db", [10, 20])
def test_noisy_corpus_no_missed_utterance(snr_db: float) -> None:
    for i in range(4):
        _one_turn(with_noise(utterance(i, "whole"), snr_db, seed=i), VadConfig())


def test_noise_alone_starts_no_turn() -> None:
    """Pink noise at the level of the 10 dB SNR corpus (and 10 dB louder) for 20 s."""
    speech = utterance(0, "whole")
    voiced = speech.audio[int(speech.speech_start_s * RATE) : int(speech.speech_end_s * RATE)]
    rms = float(np.sqrt(np.mean(voiced**2)))
    for gain in (0.316, 1.0):
        noise = pink_noise(20.0, seed=3) * rms * gain
        for threshold in (0.3, 0.5):
            assert _run(VadConfig(threshold=threshold), noise)[1] == []


def test_semantic_without_model_file_falls_back(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                               tmp_path) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "missing.onnx"))
    cfg = VadConfig.from_config({"type": "semantic_vad", "eagerness": "high"})
    with caplog.at_level(logging.WARNING, logger="realtime.vad"):
        vad = ServerVad(cfg, RATE)
    assert not vad.semantic and "served as server_vad" in caplog.text and "missing.onnx" in caplog.text
    u = utterance(2, "whole")
    fallback = _one_turn(u, cfg)[1]
    plain = _one_turn(u, VadConfig(silence_duration_ms=250))[1]
    assert fallback == plain  # server_vad with eagerness high's 250 ms of silence
