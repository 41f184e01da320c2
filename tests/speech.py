"""Synthetic speech-like audio for tests that need a voice but have no recordings and no TTS.

A voiced source (harmonics of a wandering 90-200 Hz pitch with a glottal -12 dB/octave tilt) is shaped by three
vowel formants that glide from syllable to syllable, plus a little aspiration noise, with a syllable envelope at
about 4 Hz. Additive synthesis evaluates the formant filters' magnitude response at each harmonic, so no IIR
filter (scipy) is needed. WebRTC's VAD flags it as speech (tests/test_vad.py checks).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# (F1, F2, F3) in Hz of five vowels; bandwidths per formant.
_VOWELS = np.array([[730, 1090, 2440], [270, 2290, 3010], [300, 870, 2240], [530, 1840, 2480], [570, 840, 2410]])
_BANDWIDTHS = (80.0, 100.0, 150.0)
_TOP_HZ = 5000.0


def _resonance(f: np.ndarray, centre: np.ndarray, bandwidth: float) -> np.ndarray:
    """|H(f)| of a second-order resonator with unit gain at DC."""
    return centre**2 / np.sqrt((centre**2 - f**2) ** 2 + (f * bandwidth) ** 2)


def _syllables(seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Syllable boundaries in seconds: 0, ..., seconds, about 250 ms apart."""
    edges = [0.0]
    while edges[-1] < seconds:
        edges.append(edges[-1] + rng.uniform(0.18, 0.32))
    return np.array(edges) * seconds / edges[-1]


def speech_like(seconds: float, sr: int = 24000, seed: int = 0) -> np.ndarray:
    """`seconds` of speech-like float32 audio at `sr`, peak 0.3, starting and ending at zero amplitude."""
    rng = np.random.default_rng(seed)
    n = round(seconds * sr)
    t = np.arange(n) / sr
    edges = _syllables(seconds, rng)
    u = np.interp(t, edges, np.arange(len(edges)))  # syllable index + position inside it
    envelope = np.sin(np.pi * (u % 1.0)) ** 0.5 * rng.uniform(0.6, 1.0, len(edges))[u.astype(int)]

    centres = (edges[:-1] + edges[1:]) / 2
    formants = _VOWELS[rng.integers(0, len(_VOWELS), len(centres))] * rng.uniform(0.9, 1.1, (len(centres), 1))
    tracks = [np.interp(t, centres, formants[:, i]) for i in range(3)]

    base = rng.uniform(100.0, 160.0)
    f0 = base * (1 + 0.12 * np.sin(2 * np.pi * 0.6 * t + rng.uniform(0, 6.3)) + 0.04 * np.sin(2 * np.pi * 3.1 * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = np.zeros(n)
    for k in range(1, int(_TOP_HZ / f0.min()) + 1):
        fk = k * f0
        gain = np.where(fk < _TOP_HZ, 1.0 / k, 0.0)
        for track, bandwidth in zip(tracks, _BANDWIDTHS, strict=True):
            gain = gain * _resonance(fk, track, bandwidth)
        voiced += gain * np.sin(k * phase)
    voiced /= np.abs(voiced).max()
    breath = np.convolve(rng.standard_normal(n), np.ones(4) / 4, mode="same") * 0.05
    x = (voiced + breath) * envelope
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


class Utterance(NamedTuple):
    audio: np.ndarray  # float32 mono
    sr: int
    onset_s: float  # where the speech begins
    offset_s: float  # where it ends


def speech_in_silence(
    lead_s: float = 1.0,
    speech_s: float = 2.0,
    tail_s: float = 1.5,
    sr: int = 24000,
    noise_rms: float = 3e-4,
    seed: int = 0,
) -> Utterance:
    """Low white noise (`noise_rms`, default about -70 dBFS), then `speech_like`, then noise again."""
    rng = np.random.default_rng(seed + 1)
    lead, body, tail = round(lead_s * sr), round(speech_s * sr), round(tail_s * sr)
    audio = rng.standard_normal(lead + body + tail) * noise_rms
    audio[lead : lead + body] += speech_like(speech_s, sr, seed)
    return Utterance(audio.astype(np.float32), sr, lead / sr, (lead + body) / sr)
