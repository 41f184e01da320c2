"""The custom-voice store (realtime/voice_store.py): samples in every format OpenAI lists decode to mono 24 kHz,
bad samples get a clear error, and what is stored survives reopening the data directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from realtime.voice_store import MAX_UPLOAD_BYTES, STORE_RATE, VoiceStore, decode_sample, default_data_dir
from tests.audio_files import encode_file, tone

FILES = {"wav": ("wav", "pcm_s16le"), "mpeg": ("mp3", "libmp3lame"), "ogg": ("ogg", "libopus"),
         "aac": ("adts", "aac"), "flac": ("flac", "flac"), "webm": ("webm", "libopus"), "mp4": ("mp4", "aac")}


@pytest.mark.parametrize("kind", sorted(FILES))
def test_samples_of_every_listed_format_decode_to_mono_24k(kind: str) -> None:
    pcm = tone(3.0, 44100)
    data = encode_file(np.stack([pcm]).reshape(-1), 44100, *FILES[kind])
    out = decode_sample(data)
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(len(out) - 3 * STORE_RATE) <= 0.06 * STORE_RATE, (kind, len(out))
    assert 0.1 < np.abs(out).max() < 0.6


@pytest.mark.parametrize("data, message", [
    (b"not audio at all" * 100, "could not be decoded"),
    (b"", "could not be decoded"),
    (b"\0" * (MAX_UPLOAD_BYTES + 1), "larger than 10 MiB"),
])
def test_bad_samples_get_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_sample(data)


def test_too_short_and_too_long_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="shorter than 1 s"):
        decode_sample(encode_file(tone(0.5), 24000, "wav", "pcm_s16le"))
    with pytest.raises(ValueError, match="longer than 60 s"):
        decode_sample(encode_file(np.zeros(8000 * 61, np.float32), 8000, "wav", "pcm_s16le"))


def test_store_keeps_consents_and_voices_across_reopening(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "data")
    assert not (tmp_path / "data").exists(), "nothing is made before it is used"
    consents = [store.add_consent(f"c{i}", "en-US", tone(1.0)) for i in range(3)]
    voice = store.add_voice("mine", consents[0].id, tone(2.0))
    store.close()

    again = VoiceStore(tmp_path / "data")
    assert again.voice(voice.id) == voice
    assert np.abs(again.audio(voice.id) - tone(2.0)).max() < 1e-6
    page, more = again.consents(limit=2)
    assert [c.id for c in page] == [consents[2].id, consents[1].id] and more
    page, more = again.consents(after=page[-1].id, limit=2)
    assert [c.id for c in page] == [consents[0].id] and not more
    assert again.rename_consent(consents[0].id, "renamed").name == "renamed"
    assert again.delete_voice(voice.id) and not again.delete_voice(voice.id)
    assert again.voice(voice.id) is None and not (again.audio_dir / f"{voice.id}.wav").exists()
    assert again.voices() == []
    again.close()


def test_default_data_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / "omni-realtime"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_data_dir() == Path.home() / ".local" / "share" / "omni-realtime"
