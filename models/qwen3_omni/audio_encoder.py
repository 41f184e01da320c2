"""Qwen3-Omni audio encoder (`thinker.audio_tower.*`): log-mel frames -> audio token embeddings. Each audio is cut
into chunks of 2 * n_window mel frames (100: one second), each convolved alone (three stride 2: 13 tokens per full
chunk) with sinusoidal positions restarting per chunk; the transformer attends bidirectionally inside windows of
n_window_infer frames (8 chunks, 104 tokens), never across audios. As in the reference, one call's chunks are
zero-padded to the longest before the convolutions: an audio shorter than one chunk encodes slightly differently
alone than next to a longer one."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .audio_features import audio_token_count, downsampled
from .config import AudioEncoderConfig

NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class AudioAttention(nn.Module):
    """Bidirectional multi-head attention over packed tokens, restricted to windows."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.out_proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor, slots: torch.Tensor | None, key_mask: torch.Tensor) -> torch.Tensor:
        """x: [N, dim] packed tokens; slots: [N] position of each token in the [W_n * W] window grid;
        key_mask: [W_n, W] true where a grid cell holds a token. With `slots` None, x is the grid [W_n, W, dim]."""
        if slots is None:
            return self.out_proj(self._attend(self.qkv(x), key_mask))
        nw, w = key_mask.shape
        grid = x.new_zeros(nw * w, 3 * x.shape[1])
        grid[slots] = self.qkv(x)
        return self.out_proj(self._attend(grid.view(nw, w, -1), key_mask).flatten(0, 1)[slots])

    def _attend(self, qkv: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """[W_n, W, 3 * dim] -> [W_n, W, dim], each window's cells attending to its real tokens."""
        nw, w = key_mask.shape
        q, k, v = qkv.view(nw, w, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        with sdpa_kernel(NO_CUDNN):  # cuDNN plans each new window count anew: tens of ms (profile_encoder.py)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        return out.transpose(1, 2).reshape(nw, w, self.heads * self.head_dim)


class AudioEncoderLayer(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = AudioAttention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, slots: torch.Tensor | None, key_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), slots, key_mask)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        if cfg.activation_function != "gelu":
            raise ValueError(f"audio encoder: activation '{cfg.activation_function}' is not supported (gelu only)")
        self.cfg = cfg
        c = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, c, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv_out = nn.Linear(c * downsampled(cfg.num_mel_bins), cfg.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)
        self._positions: dict[tuple[torch.device, int], torch.Tensor] = {}

    def token_count(self, frames: int | torch.Tensor) -> int | torch.Tensor:
        return audio_token_count(frames, self.cfg.n_window)

    @property
    def chunk_tokens(self) -> int:
        return int(self.token_count(2 * self.cfg.n_window))

    def window_tokens(self, chunk_tokens: int) -> int:
        return chunk_tokens * (self.cfg.n_window_infer // (2 * self.cfg.n_window))

    def forward(self, features: torch.Tensor | Sequence[torch.Tensor],
                lengths: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """features: a list of [mel, T_i], one [mel, T], or a right-padded batch [B, mel, T] with `lengths`
        (frames per audio). Returns [N_tokens, output_dim], the audios' tokens one after another."""
        audios = _as_list(features, lengths)
        chunks, chunk_lens = self._chunk(audios)
        x = self._embed(chunks)  # [num_chunks, tokens of the longest chunk, d_model]
        per_chunk = x.shape[1]
        valid = torch.arange(per_chunk) < downsampled(chunk_lens)[:, None]
        x = x.flatten(0, 1)[valid.flatten().nonzero()[:, 0].to(x.device)]
        return self.transform(x, [a.shape[1] for a in audios], per_chunk)

    def transform(self, x: torch.Tensor, frames: list[int], chunk_tokens: int) -> torch.Tensor:
        """The transformer over packed chunk embeddings [N, d_model] of audios of `frames` mel frames each."""
        slots, key_mask = self.windows(frames, chunk_tokens, x.device)
        for layer in self.layers:
            x = layer(x, slots, key_mask)
        return self.proj2(F.gelu(self.proj1(self.ln_post(x))))

    def transform_grid(self, grid: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """`transform` on the window grid [W_n, W, d_model] (what a fixed-shape step runs): [W_n, W, output_dim];
        a cell key_mask leaves out is computed and not seen by the others."""
        for layer in self.layers:
            grid = layer(grid, None, key_mask)
        return self.proj2(F.gelu(self.proj1(self.ln_post(grid))))

    def encode(self, features: torch.Tensor | Sequence[torch.Tensor],
               lengths: torch.Tensor | Sequence[int] | None = None) -> list[torch.Tensor]:
        """As `forward`, split into one [N_i, output_dim] tensor per audio."""
        audios = _as_list(features, lengths)
        counts = [int(self.token_count(a.shape[1])) for a in audios]
        return list(self.forward(audios).split(counts))

    def _chunk(self, audios: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """All audios' chunks, zero-padded to the longest: [num_chunks, mel, L], and their lengths (on CPU)."""
        size = 2 * self.cfg.n_window
        pieces = [p for a in audios for p in a.split(size, dim=1)]
        lens = torch.tensor([p.shape[1] for p in pieces])
        longest = max(p.shape[1] for p in pieces)
        padded = torch.stack([F.pad(p, (0, longest - p.shape[1])) for p in pieces])
        return padded.to(self.conv2d1.weight.dtype), lens

    def embed_chunks(self, chunks: torch.Tensor) -> torch.Tensor:
        """[num_chunks, mel, L] chunks (each padded to L) -> [num_chunks, tokens of L, d_model], positions added."""
        return self._embed(chunks.to(self.conv2d1.weight.dtype))

    def _embed(self, chunks: torch.Tensor) -> torch.Tensor:
        outs = []
        for part in chunks[:, None].split(self.cfg.conv_chunksize):
            h = F.gelu(self.conv2d1(part))
            h = F.gelu(self.conv2d2(h))
            outs.append(F.gelu(self.conv2d3(h)))
        h = torch.cat(outs)
        b, c, f, t = h.shape
        h = self.conv_out(h.permute(0, 3, 1, 2).reshape(b, t, c * f))
        return h + self._sinusoids(t, h.device).to(h.dtype)

    def _sinusoids(self, length: int, device: torch.device) -> torch.Tensor:
        """[length, d_model]: sin of position * timescales, then cos (Whisper's layout); cached."""
        key = (device, length)
        if key not in self._positions:
            half = self.cfg.d_model // 2
            step = math.log(10000.0) / (half - 1)
            inv = torch.exp(-step * torch.arange(half, device=device).float())
            t = torch.arange(length, device=device)[:, None] * inv[None, :]
            self._positions[key] = torch.cat((t.sin(), t.cos()), dim=1)
        return self._positions[key]

    def windows(self, frames: list[int], chunk_tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each packed token's slot in the [num_windows, W] grid of per-audio windows, and the grid's mask."""
        w = self.window_tokens(chunk_tokens)
        slots, fill = [], []
        for n in frames:
            count = int(self.token_count(n))
            base = len(fill) * w
            slots.append(torch.arange(count) + base)
            fill += [w] * (count // w) + ([count % w] if count % w else [])
        mask = torch.arange(w)[None, :] < torch.tensor(fill)[:, None]
        return torch.cat(slots).to(device), mask.to(device)


def _as_list(features: torch.Tensor | Sequence[torch.Tensor],
             lengths: torch.Tensor | Sequence[int] | None) -> list[torch.Tensor]:
    if isinstance(features, torch.Tensor):
        if features.dim() == 2:
            features = features[None]
        if features.dim() != 3:
            raise ValueError(f"audio features must be [mel, T] or [B, mel, T], got {tuple(features.shape)}")
        if lengths is None:
            lengths = [features.shape[2]] * features.shape[0]
        lengths = lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
        if len(lengths) != features.shape[0]:
            raise ValueError(f"{len(lengths)} lengths for a batch of {features.shape[0]} audios")
        audios = [f[:, : int(n)] for f, n in zip(features, lengths, strict=True)]
    else:
        if lengths is not None:
            raise ValueError("lengths are only for a padded batch; a list carries its own lengths")
        audios = list(features)
    if not audios or any(a.dim() != 2 or a.shape[1] < 1 for a in audios):
        raise ValueError("need at least one audio, each [mel, T] with T >= 1")
    return audios
