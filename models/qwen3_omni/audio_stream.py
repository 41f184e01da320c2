"""Encode while the user speaks: the parts of log-mel + audio encoder that later audio cannot change.
- Log-mel frame t reads samples [160 t - 200, 160 t + 200): once they exist its raw log10 power is final, but
  every feature is clamped from below at (the whole audio's maximum - 8), a floor a louder sample raises.
- A full chunk (2 * n_window frames, convolved alone) is final if the floor it was made with is the final one,
  or none of its raw values is below the final floor; a window (n_window_infer frames) of final chunks is final.
So `finish()` computes only the tail and returns what `log_mel` + the encoder give on the whole buffer."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .audio_encoder import AudioEncoder
from .audio_features import HOP_LENGTH, N_FFT, _mel_and_window


def _raw_frames(padded: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Raw log10 mel power [128, end - start] of frames start..end-1 of reflect-padded samples."""
    mel, window = _mel_and_window(padded.device)
    part = padded[start * HOP_LENGTH : (end - 1) * HOP_LENGTH + N_FFT].to(mel.dtype)
    spec = torch.stft(part, N_FFT, HOP_LENGTH, window=window, center=False, return_complex=True)
    return (mel @ spec.abs().square()).float().clamp(min=1e-10).log10()


class AudioStream:
    """One growing 16 kHz audio and its final encoder parts. `push` as audio arrives; `finish` at the commit."""

    def __init__(self, tower: AudioEncoder) -> None:
        self.tower = tower
        self.chunk = 2 * tower.cfg.n_window
        self.chunk_tokens = tower.chunk_tokens
        self.window_chunks = tower.cfg.n_window_infer // self.chunk
        self.buffer = torch.zeros(16000)  # the samples so far are buffer[:n]; it doubles when full
        self.n = 0
        self.raw = torch.zeros(tower.cfg.num_mel_bins, 0)  # final raw log-mel frames
        self.chunks: list[tuple[torch.Tensor, float]] = []  # final chunk embeddings and the floor they used
        self.windows: list[torch.Tensor] = []  # final windows' encoder outputs
        self._checked_floor = float("nan")  # the floor the chunks were last checked against
        self._sealed: tuple[int, torch.Tensor, Tail] | None = None  # `seal`'s finish_parts, for n samples

    def push(self, audio: torch.Tensor) -> None:
        """Append 16 kHz mono samples and encode what became final."""
        audio = audio.float().reshape(-1).cpu()
        if self.n + audio.numel() > self.buffer.numel():
            grown = torch.zeros(max(2 * self.buffer.numel(), self.n + audio.numel()))
            grown[: self.n] = self.buffer[: self.n]
            self.buffer = grown
        self.buffer[self.n : self.n + audio.numel()] = audio
        self.n += audio.numel()
        if self.n <= N_FFT // 2:
            return
        ready = max(0, (self.n - N_FFT // 2) // HOP_LENGTH + 1)  # frames t with 160 t + 200 <= n
        with torch.inference_mode():
            self._extend_raw(ready, end=False)
            self._encode_final()

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [128, T] as log_mel gives for the whole audio, encoder output [N, output_dim])."""
        features, tail = self.finish_parts()
        with torch.inference_mode():
            return features, finish_all(self.tower, [tail])[0]

    def seal(self) -> None:
        """No more audio comes: run `finish_parts` now, on this thread (the audio worker's, at the commit), for
        the turn's encoder step to take. Its host work (~1.75 ms a stream on the H200 box) otherwise runs on the
        engine thread, in the round every playing stream waits on."""
        if self.n > N_FFT // 2:
            self._sealed = (self.n, *self._finish_parts())

    def finish_parts(self) -> tuple[torch.Tensor, Tail]:
        """`finish` less its last transformer call, which `finish_all` runs for several streams at once: (features,
        the tail still to compute). Once only after `seal` (finish_all uses the tail up)."""
        sealed, self._sealed = self._sealed, None
        if sealed is not None and sealed[0] == self.n:
            return sealed[1], sealed[2]
        return self._finish_parts()

    def _finish_parts(self) -> tuple[torch.Tensor, Tail]:
        if self.n <= N_FFT // 2:
            raise ValueError(f"audio has {self.n} samples; log-mel needs more than {N_FFT // 2}")
        with torch.inference_mode():
            frames = self.n // HOP_LENGTH
            self._extend_raw(frames, end=True)
            raw = self.raw[:, :frames]
            floor = float(raw.amax() - 8.0)
            features = (torch.maximum(raw, raw.amax() - 8.0) + 4.0) / 4.0
            return features, self._tail(features, raw, floor)

    def fork(self) -> AudioStream:
        """A copy that goes on (push, finish) on its own; this one is unchanged."""
        twin = copy.copy(self)
        twin.buffer, twin.chunks, twin.windows = self.buffer[: self.n].clone(), list(self.chunks), list(self.windows)
        twin._sealed = None
        return twin

    def holds(self, audio: torch.Tensor) -> bool:
        return audio.numel() == self.n and torch.equal(audio.float().reshape(-1).cpu(), self.buffer[: self.n])

    @property
    def cached_chunks(self) -> int:
        return len(self.chunks)

    @property
    def cached_windows(self) -> int:
        return len(self.windows)

    def _extend_raw(self, frames: int, end: bool) -> None:
        """Raw frames up to `frames`, from samples reflect-padded as log_mel pads them (the end only once complete)."""
        have = self.raw.shape[1]
        if frames <= have:
            return
        x, half = self.buffer[: self.n], N_FFT // 2
        lo, hi = have * HOP_LENGTH, (frames - 1) * HOP_LENGTH + N_FFT  # in padded positions
        pieces = [x[1 : half + 1].flip(0)[lo:]] if lo < half else []
        pieces.append(x[max(lo - half, 0) : min(hi - half, self.n)])
        if end and hi > half + self.n:
            pieces.append(x[-half - 1 : -1].flip(0)[: hi - half - self.n])
        self.raw = torch.cat([self.raw, _raw_frames(torch.cat(pieces), 0, frames - have)], dim=1)

    def _floor(self) -> float:
        return float(self.raw.amax() - 8.0)

    def _encode_final(self) -> None:
        """Embed the final chunks (again where the floor moved under them), then run the final windows."""
        raw, floor = self.raw, self._floor()
        full = raw.shape[1] // self.chunk
        if full > len(self.chunks) or floor != self._checked_floor:
            self._refresh_chunks(raw, floor, full)
            self._checked_floor = floor
        while (len(self.windows) + 1) * self.window_chunks <= len(self.chunks):
            lo = len(self.windows) * self.window_chunks
            x = torch.cat([e for e, _ in self.chunks[lo : lo + self.window_chunks]])
            self.windows.append(self.tower.transform(x, [self.window_chunks * self.chunk], self.chunk_tokens))

    def _refresh_chunks(self, raw: torch.Tensor, floor: float, full: int) -> None:
        stale = next((k for k, (_, f) in enumerate(self.chunks) if not self._still_valid(raw, k, f, floor)), None)
        if stale is not None:
            del self.chunks[stale:]
            del self.windows[stale // self.window_chunks :]
        if full > len(self.chunks):
            lo = len(self.chunks)
            feats = (torch.maximum(raw[:, lo * self.chunk : full * self.chunk], torch.tensor(floor)) + 4.0) / 4.0
            pieces = feats.reshape(feats.shape[0], full - lo, self.chunk).permute(1, 0, 2)
            for e in self.tower.embed_chunks(pieces.to(self._device)):
                self.chunks.append((e, floor))

    def _still_valid(self, raw: torch.Tensor, k: int, made_with: float, floor: float) -> bool:
        return made_with == floor or float(raw[:, k * self.chunk : (k + 1) * self.chunk].amin()) >= floor

    @property
    def _device(self) -> torch.device:
        return self.tower.conv2d1.weight.device

    def _tail(self, features: torch.Tensor, raw: torch.Tensor, floor: float) -> Tail:
        frames = features.shape[1]
        if frames < self.chunk:  # shorter than one chunk: nothing was final, the whole call as the reference
            return Tail([self.tower(features.to(self._device))], [], None, 0, 0)
        self._refresh_chunks(raw, floor, frames // self.chunk)
        first = len(self.windows) * self.window_chunks  # first chunk the transformer still has to see
        tail = features[:, len(self.chunks) * self.chunk :]
        done = [e for e, _ in self.chunks[first:]]
        piece = None  # padded to a full chunk, as in the whole call
        if tail.shape[1]:
            piece = F.pad(tail, (0, self.chunk - tail.shape[1])).to(self._device, non_blocking=True)
        rest = frames - first * self.chunk
        return Tail(list(self.windows), done, piece, int(self.tower.token_count(tail.shape[1])), rest)


@dataclass
class Tail:
    """An audio's encoder output as finished windows plus what the transformer has yet to see: chunk embeddings and
    the last part chunk's features (`piece`, padded to a chunk, not yet embedded; its first `piece_tokens` count)."""

    windows: list[torch.Tensor]
    chunks: list[torch.Tensor]  # [tokens, d_model] each, of the last `frames` mel frames with the piece
    piece: torch.Tensor | None
    piece_tokens: int
    frames: int


def finish_all(tower: AudioEncoder, tails: list[Tail],
               transform: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Each tail's whole encoder output: the last part chunks embedded in one call, and what the tails still need
    of the transformer in one call of `transform(x, frames)` (default `tower.transform`; windows restart per audio)."""
    pieces = [t for t in tails if t.piece is not None]
    if pieces:
        embedded = tower.embed_chunks(torch.stack([t.piece for t in pieces]))
        for t, e in zip(pieces, embedded, strict=True):
            t.chunks, t.piece = [*t.chunks, e[: t.piece_tokens]], None
    open_ = [torch.cat(t.chunks) if t.chunks else None for t in tails]
    todo = [(x, t.frames) for x, t in zip(open_, tails, strict=True) if x is not None]
    rest: list[torch.Tensor] = []
    if todo:
        run = transform or (lambda x, frames: tower.transform(x, frames, tower.chunk_tokens))
        x = run(torch.cat([x for x, _ in todo]), [f for _, f in todo])
        rest = list(x.split([x.shape[0] for x, _ in todo]))
    return [torch.cat(t.windows + ([rest.pop(0)] if x is not None else [])) for x, t in zip(open_, tails, strict=True)]
