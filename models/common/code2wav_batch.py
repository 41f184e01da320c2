"""Incremental Code2Wav across streams: one frame of many streams in one batched call (`step`), or any
number of frames of one stream eagerly (`push`). After k frames a stream's samples equal `Code2Wav.decode`
of those k frames (to rounding), and a frame costs the same however many came before: each layer keeps,
per slot in preallocated buffers, just the left context it needs:

- transformer: a ring of window - 1 frames' keys per layer; frame f sits at f % (window - 1) (attention
  is order-free once rope is applied); ring index j holds a frame only if j < frames seen (the mask).
- causal convs, causal transposed convs and a StreamingEmbedding's `inputs`: the last `context` inputs,
  zeros for a fresh slot (the one-shot's padding).
- look-ahead transposed convs: the last `lookahead` inputs, put in front of the next ones; the same trim
  then yields exactly the blocks the new inputs complete (code2wav.py). A stream's first frame has none
  pending, so it yields `holdback` fewer samples: `step(first=True)` batches first frames.

`step`'s shapes depend only on the batch size (a CUDA graph can capture it), and it does no host sync.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from models.common.code2wav import CausalConv, CausalTransConv, Code2Wav, ConvNeXt, ResidualUnit
from pipelines.kv_cache import sdpa

_CAUSAL = (CausalConv, ConvNeXt, ResidualUnit, CausalTransConv)


@runtime_checkable
class StreamingEmbedding(Protocol):
    """A code embedding whose frame f also reads frames before f: forward(codes) = mix(inputs(codes), None)."""

    context: int  # frames of `inputs` before the new ones that `mix` reads
    channels: int  # channels of `inputs`

    def inputs(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, n] -> [B, channels, n], frame by frame."""

    def mix(self, x: torch.Tensor, left: torch.Tensor | None) -> torch.Tensor:
        """x [B, channels, n], left [B, channels, context] (zeros when None) -> [B, n, H]."""


def _in_channels(layer: nn.Module) -> int:
    return next(m for m in layer.modules() if isinstance(m, nn.Conv1d | nn.ConvTranspose1d)).in_channels


class _SlotKV:
    """The KVCache the transformer layers call, over the rows' slots of the ring buffers."""

    def __init__(self, owner: Code2WavSlots, slots: torch.Tensor, frames: torch.Tensor, n: int) -> None:
        self.owner, self.slots = owner, slots
        p, w = owner.ring, owner.window
        j = torch.arange(p, device=slots.device)
        seen = frames[:, None, None]  # [B, 1, 1]
        held = seen - 1 - (seen - 1 - j) % p  # the frame at ring index j
        query = seen + torch.arange(n, device=slots.device)[:, None]  # [B, n, 1]
        past = (j < seen) & (query - held < w)
        m = torch.arange(n, device=slots.device)
        new = (m <= m[:, None]) & (m[:, None] - m < w)
        self.mask = torch.cat((past, new.expand(len(slots), n, n)), dim=-1)[:, None]  # [B, 1, n, p + n]
        keep = min(n, p)
        pos = (frames[:, None] + torch.arange(n - keep, n, device=slots.device)) % p
        self.write = (slots[:, None] * p + pos).reshape(-1)
        self.keep = keep

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        kbuf, vbuf = self.owner.k[layer], self.owner.v[layer]
        keys = torch.cat((kbuf.index_select(0, self.slots), k), dim=1)
        vals = torch.cat((vbuf.index_select(0, self.slots), v), dim=1)
        flat = (-1, *kbuf.shape[2:])
        kbuf.view(flat).index_copy_(0, self.write, k[:, -self.keep :].reshape(flat))
        vbuf.view(flat).index_copy_(0, self.write, v[:, -self.keep :].reshape(flat))
        return sdpa(q, keys, vals, self.mask, scale)


class Code2WavSlots:
    """`slots` streams' state in device buffers, plus one scratch slot (`self.scratch`) for padding."""

    def __init__(self, model: Code2Wav, slots: int, device: torch.device | str, dtype: torch.dtype,
                 clamp: bool = True) -> None:
        cfg = model.cfg
        device = torch.device(device)
        w = next(model.parameters())
        if w.dtype != dtype or w.device.type != device.type:
            raise ValueError(f"model is {w.dtype} on {w.device}; slots asked for {dtype} on {device}")
        if slots < 1 or cfg.sliding_window < 2:
            raise ValueError(f"need slots >= 1 and sliding_window >= 2, got {slots}, {cfg.sliding_window}")
        self.model, self.clamp, self.scratch = model, clamp, slots
        self.window, self.ring = cfg.sliding_window, cfg.sliding_window - 1
        self.layers: list[nn.Module] = list(model.conv_layers())
        total = slots + 1
        kv = (cfg.num_hidden_layers, total, self.ring, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.zeros(kv, device=device, dtype=dtype)
        self.v = torch.zeros(kv, device=device, dtype=dtype)
        self.frames = torch.zeros(total, device=device, dtype=torch.int64)
        self.tails: dict[int, torch.Tensor] = {}
        self.pending: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if isinstance(layer, CausalTransConv) and layer.lookahead:
                self.pending[i] = torch.zeros(total, _in_channels(layer), layer.lookahead, device=device, dtype=dtype)
            elif isinstance(layer, _CAUSAL) and layer.context:
                self.tails[i] = torch.zeros(total, _in_channels(layer), layer.context, device=device, dtype=dtype)
        emb = model.code_embedding
        self.embedding = emb if isinstance(emb, StreamingEmbedding) and emb.context else None
        width = (emb.channels, emb.context) if self.embedding is not None else (0, 0)
        self.embed_tail = torch.zeros(total, *width, device=device, dtype=dtype)
        rows = (self.frames, self.embed_tail, *self.tails.values(), *self.pending.values())
        self._state = [[self.k[:, s], self.v[:, s], *(b[s] for b in rows)] for s in range(total)]  # views, made once
        self._free = list(range(slots - 1, -1, -1))
        self._open: set[int] = set()

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def open(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.scratch} Code2Wav slots are in use")
        slot = self._free.pop()
        self._open.add(slot)
        return slot

    def close(self, slot: int) -> None:
        if slot not in self._open:
            raise ValueError(f"slot {slot} is not open")
        self._open.remove(slot)
        torch._foreach_zero_(self._state[slot])  # one torch call, not two for each of ~22 buffers
        self._free.append(slot)

    @torch.no_grad()
    def push(self, slot: int, codes: torch.Tensor) -> torch.Tensor:
        """Eager, one stream (syncs): codes [1, Q] or [1, Q, n] -> samples [1, n * samples_per_frame], less
        `model.holdback` on the stream's first push."""
        if slot not in self._open:
            raise ValueError(f"slot {slot} is not open")
        if codes.dim() == 2:
            codes = codes[..., None]
        if codes.dim() != 3 or codes.shape[0] != 1 or codes.shape[-1] < 1:
            raise ValueError(f"expected codes [1, Q] or [1, Q, n>=1], got {tuple(codes.shape)}")
        slots = torch.tensor([slot], device=self.frames.device)
        return self._forward(slots, codes, fresh=int(self.frames[slot]) == 0)

    @torch.no_grad()
    def step(self, slots: torch.Tensor, codes: torch.Tensor, first: bool = False) -> torch.Tensor:
        """One frame per row: slots [B] int64, codes [B, Q] -> samples [B, samples_per_frame], less holdback
        with `first` (every row's first frame; without it, none is). Rows are distinct slots, but padding
        rows at `self.scratch`. Rows are checked only on the CPU (on a GPU that would sync)."""
        if codes.dim() != 2 or slots.shape != codes.shape[:1]:
            raise ValueError(f"expected slots [B] and codes [B, Q], got {tuple(slots.shape)}, {tuple(codes.shape)}")
        if slots.device.type == "cpu":
            self._check(slots.tolist(), first)
        return self._forward(slots, codes[..., None], fresh=first)

    def _check(self, rows: list[int], first: bool) -> None:
        real = [s for s in rows if s != self.scratch]
        if len(set(real)) != len(real):
            raise ValueError(f"a slot appears twice in one step: {rows}")
        for s in real:
            if s not in self._open:
                raise ValueError(f"slot {s} is not open")
            if (int(self.frames[s]) == 0) != first:
                raise ValueError(f"slot {s} has {int(self.frames[s])} frames: a stream's first frame, and only "
                                 "that, goes to push() or step(first=True)")

    def _forward(self, slots: torch.Tensor, codes: torch.Tensor, fresh: bool) -> torch.Tensor:
        n = codes.shape[-1]
        frames = self.frames.index_select(0, slots)
        positions = frames[:, None] + torch.arange(n, device=slots.device)
        kv = _SlotKV(self, slots, frames, n)
        h = self.model.pre_transformer(self._embed(slots, codes), positions, kv).transpose(1, 2)
        self.frames.index_copy_(0, slots, frames + n)
        for i, layer in enumerate(self.layers):
            if i in self.tails:
                left = self.tails[i].index_select(0, slots)
                joined = torch.cat((left, h), dim=-1)
                self.tails[i].index_copy_(0, slots, joined[..., joined.shape[-1] - layer.context :])
                h = layer.joined(joined)
            elif i in self.pending:
                seq = h if fresh else torch.cat((self.pending[i].index_select(0, slots), h), dim=-1)
                self.pending[i].index_copy_(0, slots, seq[..., seq.shape[-1] - layer.lookahead :])
                h = layer(seq)
            else:
                h = layer(h)
        h = h[:, 0]
        return h.clamp(-1, 1) if self.clamp else h

    def _embed(self, slots: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        emb = self.embedding
        if emb is None:
            return self.model.embed(codes)
        x = emb.inputs(codes)
        left = self.embed_tail.index_select(0, slots)
        joined = torch.cat((left, x), dim=-1)
        self.embed_tail.index_copy_(0, slots, joined[..., joined.shape[-1] - emb.context :])
        return emb.mix(x, left)
