"""Turn detection on synthetic speech: config mapping, event timing, chunking, noise, clicks, eagerness, idle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import webrtcvad

from realtime.audio import AudioFormat, to_model_rate
from realtime.pcm import float_to_pcm16
from realtime.vad import IdleTimeout, ServerVad, SpeechStarted, SpeechStopped, VadConfig, VadEvent
from tests.speech import Utterance, speech_in_silence, speech_like

FRAME = 480  # 30 ms at 16 kHz
RATE = 16000  # the audio the detector is pushed: the model's input rate


def _16k(x: np.ndarray) -> torch.Tensor:
    return to_model_rate(torch.from_numpy(x), AudioFormat("audio/pcm", 24000), RATE)


def _run(cfg: VadConfig, x: np.ndarray | torch.Tensor, chunk: int | None = None) -> list[VadEvent]:
    vad, x = ServerVad(cfg, RATE), torch.as_tensor(x)
    step = chunk or len(x)
    return [e for i in range(0, len(x), step) for e in vad.push(x[i : i + step])]


def _noise(seconds: float, rms: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(round(seconds * 16000)) * rms).astype(np.float32)


def test_config_mapping_and_validation() -> None:
    assert [VadConfig(threshold=t).aggressiveness for t in (0, 0.24, 0.25, 0.5, 0.74, 0.75, 1)] == [0, 0, 1, 2, 2, 3, 3]
    cfg = VadConfig.from_config({"type": "server_vad", "threshold": 0.7, "idle_timeout_ms": None})
    assert (cfg.threshold, cfg.prefix_padding_ms, cfg.silence_duration_ms, cfg.idle_timeout_ms) == (0.7, 300, 500, None)
    assert VadConfig.from_config(cfg.to_config()) == cfg
    for eagerness, silence_ms in (("low", 1000), ("medium", 500), ("high", 250)):
        assert VadConfig.from_config({"type": "semantic_vad", "eagerness": eagerness}).silence_duration_ms == silence_ms
    semantic = VadConfig.from_config({"type": "semantic_vad"})
    assert semantic.eagerness == "auto" and semantic.silence_duration_ms == 500
    assert semantic.to_config() == {"type": "semantic_vad", "create_response": True, "interrupt_response": True,
                                    "eagerness": "auto"}
    bad = [
        ({"type": "server_vad", "threshold": 1.5}, "threshold"),
        ({"type": "server_vad", "threshold": "high"}, "invalid server_vad"),
        ({"type": "server_vad", "eagerness": "low"}, "unknown server_vad field"),
        ({"type": "semantic_vad", "idle_timeout_ms": 5000}, "unknown semantic_vad field"),
        ({"type": "semantic_vad", "eagerness": "fast"}, "eagerness"),
        ({"type": "push_to_talk"}, "unsupported turn_detection type"),
        ({"type": "server_vad", "silence_duration_ms": 0}, "silence_duration_ms"),
    ]
    for cfg_dict, message in bad:
        with pytest.raises(ValueError, match=message):
            VadConfig.from_config(cfg_dict)


def test_synthetic_speech_is_speech_to_webrtc() -> None:
    """The test voice must really be speech to WebRTC, and its background must not be, at the strictest mode."""
    for seed in range(3):
        u = speech_in_silence(1.0, 2.0, 1.0, seed=seed)
        pcm = float_to_pcm16(_16k(u.audio))
        vad = webrtcvad.Vad(3)
        flags = np.array([vad.is_speech(pcm[i : i + 2 * FRAME], 16000) for i in range(0, len(pcm) - 959, 2 * FRAME)])
        speech = slice(round(u.onset_s / 0.03) + 2, round(u.offset_s / 0.03) - 1)
        assert flags[speech].mean() > 0.95
        assert flags[10 : round(u.onset_s / 0.03) - 1].sum() == 0


def _timing(u: Utterance, cfg: VadConfig, chunk: int | None = None) -> tuple[float, float, float]:
    """(start error, stop error, speech end error) in ms; asserts exactly one start and one stop."""
    events = _run(cfg, _16k(u.audio), chunk)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    start, stop = events
    onset, offset = u.onset_s * 1000, u.offset_s * 1000
    return (start.audio_start_ms + cfg.prefix_padding_ms - onset, stop.audio_end_ms - cfg.silence_duration_ms - offset,
            stop.speech_end_ms - offset)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_events_near_true_onset_and_offset(seed: int) -> None:
    u = speech_in_silence(1.0 + 0.11 * seed, 1.5 + 0.5 * seed, 1.5, seed=seed)
    start_err, stop_err, end_err = _timing(u, VadConfig())
    # Measured: start -10..-20 ms (frame grid), stop +100..+140 ms (WebRTC's hangover + rounding to frames).
    assert -60 <= start_err <= 100
    assert 0 <= stop_err <= 200 and 0 <= end_err <= 150


def test_prefix_padding_clamps_at_origin() -> None:
    u = speech_in_silence(1.0, 1.0, 1.0)
    start = _run(VadConfig(prefix_padding_ms=2000), _16k(u.audio))[0]
    assert start == SpeechStarted(0)


def test_chunk_size_independence() -> None:
    u = speech_in_silence(0.8, 1.2, 1.0, seed=4)
    x = _16k(u.audio)
    whole = _run(VadConfig(), x)
    assert len(whole) == 2
    assert _run(VadConfig(), x, chunk=112) == whole  # 7 ms chunks
    assert _run(VadConfig(), x.numpy(), chunk=FRAME + 1) == whole


@pytest.mark.parametrize("rms", [3e-4, 3e-3, 1e-2])
def test_low_noise_gives_no_events(rms: float) -> None:
    assert _run(VadConfig(), _noise(5.0, rms)) == []


def test_threshold_sets_sensitivity() -> None:
    loud_noise = _noise(4.0, 0.03)  # about -30 dBFS
    assert isinstance(_run(VadConfig(threshold=0.1), loud_noise)[0], SpeechStarted)
    assert _run(VadConfig(threshold=0.5), loud_noise) == []
    assert _run(VadConfig(threshold=0.9), loud_noise) == []


def test_clicks_do_not_start_speech() -> None:
    x = _noise(6.0, 3e-4)
    for k in range(1, 11):
        i = k * 8000 + k * 97 % FRAME
        x[i : i + 200] += np.hanning(200).astype(np.float32) * 0.8 * (-1) ** k
    for threshold in (0.0, 0.5, 1.0):
        assert _run(VadConfig(threshold=threshold), x) == []
    assert isinstance(_run(VadConfig(min_speech_ms=30), x)[0], SpeechStarted)  # a 1-frame run would open a turn


def test_semantic_eagerness_changes_stop_time() -> None:
    u = speech_in_silence(1.0, 1.5, 2.0, seed=5)
    stops = {}
    for eagerness in ("high", "auto", "low"):
        cfg = VadConfig.from_config({"type": "semantic_vad", "eagerness": eagerness})
        start, stop = _run(cfg, _16k(u.audio))
        stops[eagerness] = stop.audio_end_ms
    assert 240 <= stops["auto"] - stops["high"] <= 270 and 480 <= stops["low"] - stops["auto"] <= 510


def test_two_turns_and_reset_origin() -> None:
    a, b = speech_in_silence(1.0, 1.0, 1.0, seed=6), speech_in_silence(0.5, 1.5, 1.0, seed=7)
    x = _16k(np.concatenate([a.audio, b.audio]))
    events = _run(VadConfig(), x)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] * 2
    second_onset = (len(a.audio) / 24000 + b.onset_s) * 1000
    assert abs(events[2].audio_start_ms + 300 - second_onset) <= 60

    vad = ServerVad(VadConfig(), RATE)
    vad.push(x[:24000])  # reset 1.5 s in, in the middle of the first utterance
    vad.reset(origin_ms=10_000)
    shifted = vad.push(x[24000:])
    assert [type(e) for e in shifted] == [SpeechStarted, SpeechStopped] * 2
    assert shifted[0] == SpeechStarted(10_000)  # clamped at the new origin
    assert shifted[2].audio_start_ms - 10_000 == events[2].audio_start_ms - 1500


def test_idle_timeout() -> None:
    vad = ServerVad(VadConfig(idle_timeout_ms=2000), RATE)
    assert vad.push(_noise(1.0, 3e-4)) == []
    vad.arm_idle(1000)
    events = vad.push(_noise(3.0, 3e-4, seed=1))
    assert events == [IdleTimeout(1000, 3000)]  # the first frame end at or after 1000 + 2000 ms
    vad.arm_idle(4000)
    assert vad.idle(5999) is None and vad.idle(6000) == IdleTimeout(4000, 6000) and vad.idle(7000) is None

    speech = _16k(speech_in_silence(0.5, 2.5, 0.2, seed=8).audio)
    vad.arm_idle(vad.position_ms)
    assert [type(e) for e in vad.push(speech)] == [SpeechStarted]  # speech disarms the timer
    assert vad.idle(vad.position_ms + 10_000) is None

    plain = ServerVad(VadConfig(), RATE)
    plain.arm_idle(0)
    assert plain.push(_noise(3.0, 3e-4)) == [] and plain.idle(100_000) is None


def test_synthetic_speech_generator() -> None:
    x = speech_like(1.5, 24000, seed=1)
    assert x.dtype == np.float32 and x.shape == (36000,) and abs(float(np.abs(x).max()) - 0.3) < 1e-6
    assert np.array_equal(x, speech_like(1.5, 24000, seed=1)) and not np.array_equal(x, speech_like(1.5, seed=2))
    u = speech_in_silence(0.5, 1.0, 0.25, sr=16000)
    assert (u.onset_s, u.offset_s, len(u.audio)) == (0.5, 1.5, 28000)
    assert np.abs(u.audio[:8000]).max() < 0.01 < np.abs(u.audio[8000:24000]).max()
