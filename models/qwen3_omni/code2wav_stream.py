"""Incremental Code2Wav: push codec frames, get back the new samples, final as soon as they exist.

After k frames, the concatenated pushes equal `Code2Wav.decode` of those k frames (to float rounding),
and a push costs the same however many frames came before: each layer keeps just the left context
it needs. Why that is exact, layer by layer (see code2wav.py):

- transformer: causal, window W frames. A new frame attends to itself and the W-1 frames before it,
  so the cache keeps W-1 keys and values per layer; positions continue from the frames seen.
- causal conv (stride 1, extent (k-1)d, zero left padding of that size): an output needs the (k-1)d
  inputs before it, kept as the layer's tail; the initial all-zero tail is the one-shot's padding.
  ConvNeXt (depthwise k=7) and residual units (dilated k=7 after a pointwise SnakeBeta) alike.
- upsampling transposed conv (kernel = stride): no overlap, nothing to keep.
- decoder transposed conv (kernel 2r, stride r, trimmed by r at both ends): output block j is made
  from inputs j and j+1, and the one-shot drops the block that would need the input after the last.
  The last input is kept pending and put in front of the next ones; the same trim then yields exactly
  the blocks the new inputs complete (at the first push, with nothing pending, it is the one-shot's
  own left trim).

Hold-back: if h samples at a transposed conv's input are still to come, (h + lookahead) * stride at
its output are. With rates 8, 5, 4, 3 after the upsampling: 8 -> 45 -> 184 -> 555 samples. So the
first frame gives 1920 - 555 samples and every later frame 1920; like the one-shot decode, the stream
never produces the last 555 (23 ms), which would need a frame after the end.
"""

from __future__ import annotations

import torch
from torch import nn

from models.qwen3_omni.code2wav import CausalConv, CausalTransConv, Code2Wav, ConvNeXt, ResidualUnit, SlidingKV

_CAUSAL = (CausalConv, ConvNeXt, ResidualUnit)


class Code2WavStream:
    """A batch of streams decoded in lock-step: every row gets the same number of frames per push.

    State: transformer KV (window - 1 frames per layer), the number of frames seen (positions), each
    causal layer's left-context tail, and each look-ahead transposed conv's pending input.
    """

    def __init__(self, model: Code2Wav, clamp: bool = True) -> None:
        self.model, self.clamp = model, clamp
        self.layers: list[nn.Module] = list(model.conv_layers())
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next push starts a new stream."""
        self.frames = 0
        self.batch = 0
        self.cache: SlidingKV = self.model.new_cache()
        self.tails: dict[int, torch.Tensor] = {}
        self.pending: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q] (one frame) or [B, Q, n] -> the new samples [B, 1, S].

        S = n * samples_per_frame, less `model.holdback` on the stream's first push.
        """
        if codes.dim() == 2:
            codes = codes[..., None]
        b, _, n = codes.shape
        if self.frames and b != self.batch:
            raise ValueError(f"stream has batch {self.batch}, got codes of shape {tuple(codes.shape)}")
        self.batch = b
        positions = torch.arange(self.frames, self.frames + n, device=codes.device).expand(b, n)
        h = self.model.pre_transformer(self.model.embed(codes), positions, self.cache).transpose(1, 2)
        self.frames += n
        for i, layer in enumerate(self.layers):
            if isinstance(layer, CausalTransConv):
                h = self._transposed(i, layer, h)
            elif isinstance(layer, _CAUSAL):
                h = self._causal(i, layer, h)
            else:
                h = layer(h)
        return h.clamp(-1, 1) if self.clamp else h

    def flush(self) -> torch.Tensor:
        """End the stream: returns what is left to emit, then reset().

        Nothing is left: the one-shot decode also stops `holdback` samples short of frames * 1920.
        """
        out = self.model.code_embedding.weight.new_zeros(self.batch, 1, 0)
        self.reset()
        return out

    def _causal(self, i: int, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        c = layer.context
        tail = self.tails.get(i)
        if tail is None:
            tail = x.new_zeros(x.shape[0], x.shape[1], c)
        joined = x if x.shape[-1] >= c else torch.cat((tail, x), dim=-1)
        self.tails[i] = joined[..., joined.shape[-1] - c :]
        return layer(x, tail)

    def _transposed(self, i: int, layer: CausalTransConv, x: torch.Tensor) -> torch.Tensor:
        a = layer.lookahead
        if a == 0:
            return layer(x)
        pending = self.pending.get(i)
        seq = x if pending is None else torch.cat((pending, x), dim=-1)
        self.pending[i] = seq[..., seq.shape[-1] - a :]
        return layer(seq)
