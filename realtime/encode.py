"""Speech audio encoded as it is made, for /v1/audio/speech's `response_format`s: FFmpeg's muxers through PyAV on
a stream that cannot seek (every byte is final when written), and `pcm` as raw 24 kHz PCM16 LE, as OpenAI's."""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np

PCM_RATE = 24000  # OpenAI's `pcm` is 24 kHz whatever the model's rate


@dataclass(frozen=True)
class Format:
    container: str
    codec: str
    content_type: str
    rate: int = 0  # the codec's rate (0: the model's)


FORMATS = {
    "mp3": Format("mp3", "libmp3lame", "audio/mpeg"),
    "opus": Format("ogg", "libopus", "audio/ogg", rate=48000),  # Opus runs at 48 kHz
    "aac": Format("adts", "aac", "audio/aac"),
    "flac": Format("flac", "flac", "audio/flac"),
    "wav": Format("wav", "pcm_s16le", "audio/wav"),
    "pcm": Format("", "", "audio/pcm"),
}


class _Sink:
    """A write-only byte sink: with no `seek`, the muxers write streaming headers (no sizes to patch later)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class Encoder:
    """`push` mono float32 chunks at `rate` Hz, get the encoded bytes made so far; `flush` once at the end."""

    def __init__(self, response_format: str, rate: int) -> None:
        if response_format not in FORMATS:
            raise ValueError(f"unknown response_format {response_format!r} (one of {', '.join(FORMATS)})")
        self.format, self.rate = FORMATS[response_format], rate
        self.pts = 0
        self._sink = _Sink()
        self._container: av.container.OutputContainer | None = None
        self._resampler: av.AudioResampler | None = None
        if self.format.container:
            self._container = av.open(self._sink, "w", format=self.format.container, buffer_size=4096,
                                      options={"flush_packets": "1"})
            self._stream = self._container.add_stream(self.format.codec, rate=self.format.rate or rate)
            self._stream.layout = "mono"
        else:
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=PCM_RATE)

    def push(self, pcm: np.ndarray) -> bytes:
        if not len(pcm):
            return b""
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, np.float32)[None], format="flt", layout="mono")
        frame.sample_rate, frame.pts = self.rate, self.pts
        self.pts += len(pcm)
        return self._encode(frame)

    def flush(self) -> bytes:
        out = self._encode(None)
        self.close()
        return out + self._sink.take()

    def close(self) -> None:
        """Release the codec (after `flush`, or without finishing the stream when a request ended early)."""
        if self._container is not None:
            self._container.close()
        self._container = self._resampler = None

    def _encode(self, frame: av.AudioFrame | None) -> bytes:
        if self._resampler is not None:
            return b"".join(f.to_ndarray().tobytes() for f in self._resampler.resample(frame))
        if self._container is not None:
            self._container.mux(self._stream.encode(frame))
        return self._sink.take()
