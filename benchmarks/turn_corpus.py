"""Spoken test utterances for turn detection, made with espeak-ng (speech) and sox (rate, level, noise).

Each sentence is spoken whole, and in two parts with a mid-sentence pause of 300-900 ms between them (the parts
spoken separately, so each ends as espeak-ng ends any utterance: synthetic prosody falls at the cut). The first
part alone is the sentence cut mid-way. Noise is sox's pink noise mixed at a given SNR to the speech's RMS.
Everything is 16 kHz mono float32 and deterministic for its arguments.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import soundfile as sf

RATE = 16000
# (first part, rest): the cut falls where a speaker might pause, mid-sentence
SENTENCES = (
    ("Please remind me to call my sister when", "I get home from work."),
    ("My favourite book is the one about a boy,", "who lives on a small island."),
    ("Could you tell me how the weather will be,", "in Paris tomorrow morning?"),
    ("If it rains tomorrow,", "we will stay at home and watch a film."),
    ("When you get to the station,", "turn left and walk to the bridge."),
    ("I need to buy eggs, milk,", "and a loaf of bread."),
    ("After the concert ended,", "we walked home through the park."),
    ("What is the fastest way to get", "from the airport to the city centre?"),
)


def available() -> bool:
    return shutil.which("espeak-ng") is not None and shutil.which("sox") is not None


@lru_cache(maxsize=64)
def speak(text: str, speed: int = 165, voice: str = "en-us") -> np.ndarray:
    """espeak-ng's rendering of `text` at 16 kHz, peak-normalised to -3 dBFS, silence trimmed off both ends."""
    with tempfile.TemporaryDirectory() as tmp:
        raw, out = Path(tmp) / "raw.wav", Path(tmp) / "out.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text], check=True)
        subprocess.run(["sox", "-R", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(out), "norm", "-3",
                        "silence", "1", "0.02", "0.1%", "reverse", "silence", "1", "0.02", "0.1%", "reverse"],
                       check=True)
        audio, rate = sf.read(out, dtype="float32")
    assert rate == RATE
    return audio


@lru_cache(maxsize=16)
def pink_noise(seconds: float, seed: int = 0) -> np.ndarray:
    """sox's pink noise, unit RMS, 16 kHz (repeatable for a seed: sox -R, then a seeded rotation)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "noise.wav"
        subprocess.run(["sox", "-R", "-n", "-r", str(RATE), "-c", "1", "-b", "16", str(out), "synth",
                        f"{seconds + 1:.3f}", "pinknoise"], check=True)
        noise, _ = sf.read(out, dtype="float32")
    noise = np.roll(noise, seed * 7919)[: round(seconds * RATE)]
    return (noise / np.sqrt(np.mean(noise**2))).astype(np.float32)


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000, np.float32)


@dataclass(frozen=True)
class Utterance:
    """Audio with its speech: `audio` (16 kHz), `speech_end_s` (end of the last word), `pauses` ((start, end) s of
    mid-sentence pauses), `complete` (whether it ends a sentence)."""

    name: str
    audio: np.ndarray
    speech_start_s: float
    speech_end_s: float
    pauses: tuple[tuple[float, float], ...]
    complete: bool


def utterance(i: int, kind: str, pause_ms: int = 600, lead_ms: int = 500, tail_ms: int = 1500) -> Utterance:
    """Sentence `i`: kind "whole", "paused" (a `pause_ms` pause at the cut) or "cut" (the first part only)."""
    first, rest = SENTENCES[i % len(SENTENCES)]
    lead = silence(lead_ms)
    if kind == "whole":
        speech, pauses = speak(f"{first} {rest}"), ()
    elif kind == "cut":
        speech, pauses = speak(first), ()
    elif kind == "paused":
        a, b = speak(first), speak(rest)
        speech = np.concatenate([a, silence(pause_ms), b])
        at = lead_ms / 1000 + len(a) / RATE
        pauses = ((at, at + pause_ms / 1000),)
    else:
        raise ValueError(f"unknown utterance kind {kind!r}")
    start = lead_ms / 1000
    audio = np.concatenate([lead, speech, silence(tail_ms)])
    return Utterance(f"{kind}{i}", audio, start, start + len(speech) / RATE, pauses, kind != "cut")


def with_noise(u: Utterance, snr_db: float, seed: int = 0) -> Utterance:
    """`u` with pink noise under all of it, at `snr_db` below the RMS of its speech."""
    speech = u.audio[round(u.speech_start_s * RATE) : round(u.speech_end_s * RATE)]
    rms = float(np.sqrt(np.mean(speech**2))) * 10 ** (-snr_db / 20)
    noisy = u.audio + pink_noise(len(u.audio) / RATE, seed) * rms
    return Utterance(f"{u.name}@{snr_db:g}dB", noisy.astype(np.float32), u.speech_start_s, u.speech_end_s,
                     u.pauses, u.complete)


def scaled(u: Utterance, gain_db: float) -> Utterance:
    return Utterance(f"{u.name}{gain_db:+g}dB", (u.audio * 10 ** (gain_db / 20)).astype(np.float32),
                     u.speech_start_s, u.speech_end_s, u.pauses, u.complete)
