"""Custom voices and consent recordings kept across restarts: SQLite rows, mono float WAVs at STORE_RATE, in one dir."""

from __future__ import annotations

import io
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import av
import numpy as np
import soundfile as sf

STORE_RATE = 24000
MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # as OpenAI's
MIN_SAMPLE_S, MAX_SAMPLE_S = 1.0, 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS consents (id TEXT PRIMARY KEY, name TEXT NOT NULL, language TEXT NOT NULL,
                                     created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS voices (id TEXT PRIMARY KEY, name TEXT NOT NULL, consent TEXT NOT NULL,
                                   created_at INTEGER NOT NULL);
"""


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "omni-realtime"


def decode_sample(data: bytes, what: str = "audio sample") -> np.ndarray:
    """Mono float32 at STORE_RATE from an audio file's bytes; ValueError with a clear message for anything else."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise ValueError(f"The {what} is larger than {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB.")
    resampler = av.AudioResampler(format="flt", layout="mono", rate=STORE_RATE)
    parts: list[np.ndarray] = []
    n, limit = 0, int(MAX_SAMPLE_S * STORE_RATE)
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if not container.streams.audio:
                raise ValueError(f"The {what} has no audio stream.")
            for frame in container.decode(container.streams.audio[0]):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray()[0])
                    n += out.samples
                if n > limit:
                    raise ValueError(f"The {what} is longer than {MAX_SAMPLE_S:.0f} s.")
            parts += [out.to_ndarray()[0] for out in resampler.resample(None)]
    except (av.error.FFmpegError, UnicodeDecodeError) as e:
        raise ValueError(f"The {what} could not be decoded as audio (mpeg, wav, ogg, aac, flac, webm or mp4): "
                         f"{e}") from None
    pcm = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if len(pcm) < MIN_SAMPLE_S * STORE_RATE:
        raise ValueError(f"The {what} is shorter than {MIN_SAMPLE_S:.0f} s of audio.")
    return pcm.astype(np.float32)


@dataclass(frozen=True)
class Consent:
    id: str
    name: str
    language: str
    created_at: int

    def to_api(self) -> dict:
        return asdict(self) | {"object": "audio.voice_consent"}


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    consent: str
    created_at: int

    def to_api(self) -> dict:
        return {"id": self.id, "name": self.name, "created_at": self.created_at, "object": "audio.voice",
                "type": "audio_sample"}


class VoiceStore:
    """The data directory's `voices.sqlite3` and its `audio/` folder. Safe to use from several threads."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir)
        self.audio_dir = self.dir / "audio"
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None  # opened on first use: a server nobody asks for voices makes none

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _sql(self, query: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            if self._db is None:
                self.audio_dir.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.dir / "voices.sqlite3", check_same_thread=False, isolation_level=None)
                self._db.executescript(SCHEMA)
            return self._db.execute(query, args).fetchall()

    def add_consent(self, name: str, language: str, recording: np.ndarray) -> Consent:
        consent = Consent(f"cons_{secrets.token_hex(12)}", name, language, int(time.time()))
        self._write_audio(consent.id, recording)
        self._sql("INSERT INTO consents VALUES (?, ?, ?, ?)", (consent.id, name, language, consent.created_at))
        return consent

    def consent(self, consent_id: str) -> Consent | None:
        row = self._sql("SELECT id, name, language, created_at FROM consents WHERE id = ?", (consent_id,))
        return Consent(*row[0]) if row else None

    def consents(self, after: str | None = None, limit: int = 20) -> tuple[list[Consent], bool]:
        """Newest first, from after the consent `after`; with whether more follow."""
        query = "SELECT id, name, language, created_at FROM consents"
        args: tuple = ()
        if after:
            query += " WHERE rowid < (SELECT rowid FROM consents WHERE id = ?)"
            args = (after,)
        rows = self._sql(query + " ORDER BY rowid DESC LIMIT ?", (*args, limit + 1))
        return [Consent(*r) for r in rows[:limit]], len(rows) > limit

    def rename_consent(self, consent_id: str, name: str) -> Consent | None:
        self._sql("UPDATE consents SET name = ? WHERE id = ?", (name, consent_id))
        return self.consent(consent_id)

    def delete_consent(self, consent_id: str) -> bool:
        return self._delete("consents", consent_id)

    def add_voice(self, name: str, consent: str, sample: np.ndarray) -> Voice:
        voice = Voice(f"voice_{secrets.token_hex(12)}", name, consent, int(time.time()))
        self._write_audio(voice.id, sample)
        self._sql("INSERT INTO voices VALUES (?, ?, ?, ?)", (voice.id, name, consent, voice.created_at))
        return voice

    def voice(self, voice_id: str) -> Voice | None:
        row = self._sql("SELECT id, name, consent, created_at FROM voices WHERE id = ?", (voice_id,))
        return Voice(*row[0]) if row else None

    def voices(self) -> list[Voice]:
        return [Voice(*r) for r in self._sql("SELECT id, name, consent, created_at FROM voices ORDER BY rowid DESC")]

    def delete_voice(self, voice_id: str) -> bool:
        return self._delete("voices", voice_id)

    def audio(self, item_id: str) -> np.ndarray:
        """A stored recording or sample: mono float32 at STORE_RATE."""
        pcm, _ = sf.read(self._path(item_id), dtype="float32")
        return pcm

    def _delete(self, table: str, item_id: str) -> bool:
        gone = bool(self._sql(f"DELETE FROM {table} WHERE id = ? RETURNING id", (item_id,)))
        if gone:
            self._path(item_id).unlink(missing_ok=True)
        return gone

    def _path(self, item_id: str) -> Path:
        return self.audio_dir / f"{item_id}.wav"

    def _write_audio(self, item_id: str, pcm: np.ndarray) -> None:
        self.audio_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._path(item_id).with_suffix(".tmp")
        sf.write(tmp, pcm, STORE_RATE, subtype="FLOAT", format="WAV")
        tmp.replace(self._path(item_id))
