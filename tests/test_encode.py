"""Speech encoders (realtime/encode.py): every response_format, fed in small chunks as a model makes them,
decodes back with FFmpeg to its rate and the input's length; bytes come out as the audio goes in."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.encode import FORMATS, Encoder
from tests.audio_files import decode, tone

RATE = 24000
# the codec's own delay and padding, at most one or two of its frames (mp3 1152 + 529, aac 1024)
SLACK = {"mp3": 2 * 1152, "aac": 2 * 1024, "opus": 0, "flac": 0, "wav": 0}


def encode_chunks(fmt: str, pcm: np.ndarray, chunk: int = 1920) -> list[bytes]:
    enc = Encoder(fmt, RATE)
    parts = [enc.push(pcm[i : i + chunk]) for i in range(0, len(pcm), chunk)]
    return [*parts, enc.flush()]


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_every_container_format_decodes_to_its_rate_and_length(fmt: str) -> None:
    pcm = tone(2.0)
    parts = encode_chunks(fmt, pcm)
    rate, n, _ = decode(b"".join(parts))
    want_rate = 48000 if fmt == "opus" else RATE
    assert rate == want_rate
    want = len(pcm) * want_rate // RATE
    assert want <= n <= want + SLACK[fmt] * want_rate // RATE, (fmt, n, want)
    made_early = sum(len(p) for p in parts[: len(parts) // 2])
    assert made_early > 0, f"{fmt}: nothing came out before the end"


def test_pcm_is_raw_24k_s16le_and_streams_exactly() -> None:
    pcm = tone(1.0)
    parts = encode_chunks("pcm", pcm)
    out = np.frombuffer(b"".join(parts), "<i2")
    assert len(out) == len(pcm)
    assert np.abs(out / 32767 - pcm).max() < 1e-3
    assert all(len(p) == 1920 * 2 for p in parts[:-2])


def test_pcm_from_another_rate_is_resampled_to_24k() -> None:
    enc = Encoder("pcm", 16000)
    data = enc.push(tone(1.0, 16000)) + enc.flush()
    assert abs(len(data) // 2 - 24000) <= 32


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="response_format"):
        Encoder("ogg", RATE)
    assert set(FORMATS) == {"mp3", "opus", "aac", "flac", "wav", "pcm"}


def test_close_without_flush_releases_the_codec() -> None:
    enc = Encoder("mp3", RATE)
    enc.push(tone(0.5))
    enc.close()
    enc.close()
