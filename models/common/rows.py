"""A growing [N, H] tensor kept as chunks: a conversation's inputs, a stream's prompt and frames."""

from __future__ import annotations

import torch


class Rows:
    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []
        self.n = 0

    def append(self, rows: torch.Tensor) -> None:
        self.chunks.append(rows)
        self.n += rows.shape[0]

    def tail(self, start: int) -> torch.Tensor:
        picked, end = [], self.n
        for chunk in reversed(self.chunks):
            if end <= start:
                break
            lo = max(0, chunk.shape[0] - (end - start))
            picked.append(chunk[lo:] if lo else chunk)
            end -= chunk.shape[0]
        if len(picked) == 1:
            return picked[0]  # a view: the chunks are never written in place
        return torch.cat(picked[::-1]) if picked else self.chunks[0][:0]

    def all(self) -> torch.Tensor:
        return self.tail(0)

    def truncate(self, n: int) -> None:
        while self.n > n:
            last = self.chunks[-1]
            drop = min(last.shape[0], self.n - n)
            self.n -= drop
            if drop == last.shape[0]:
                self.chunks.pop()
            else:
                self.chunks[-1] = last[: last.shape[0] - drop]
