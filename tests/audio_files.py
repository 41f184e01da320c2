"""Decoding and making audio files with PyAV, for the speech and custom-voice tests."""

from __future__ import annotations

import io

import av
import numpy as np


def decode(data: bytes) -> tuple[int, int, str]:
    """(sample rate, samples per channel, codec name) of an encoded file, decoded in full by FFmpeg."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        n = sum(frame.samples for frame in container.decode(stream))
        return stream.codec_context.sample_rate, n, stream.codec_context.name


def tone(seconds: float, rate: int = 24000, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def encode_file(pcm: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """`pcm` as a complete file (a seekable one: sizes and headers final), e.g. ("webm", "libopus")."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=48000 if codec == "libopus" else rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[None].astype(np.float32), format="flt", layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()
