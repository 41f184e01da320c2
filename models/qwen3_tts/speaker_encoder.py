"""Base's speaker encoder: an ECAPA-TDNN turning 24 kHz reference audio into the x-vector that stands in the
talker prompt where a named speaker's codec row would (checkpoint prefix `speaker_encoder.`). Its input is a
128-bin log-mel spectrogram (n_fft 1024, hop 256, Hann window, Slaney mel filters from 0 to 12 kHz, reflect padding
of (n_fft - hop) / 2 each side, magnitudes floored at 1e-5 before the log). Every conv is 'same' padded with
reflection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.common.mel import mel_filterbank

RATE, N_FFT, HOP, MELS, FMAX = 24000, 1024, 256, 128, 12000
_MELS = torch.from_numpy(mel_filterbank(RATE, N_FFT, MELS, FMAX).T).float()  # [MELS, N_FFT // 2 + 1]


def log_mel(wave: torch.Tensor) -> torch.Tensor:
    """Mono waveform [T] at 24 kHz -> [frames, 128]."""
    pad = (N_FFT - HOP) // 2
    y = F.pad(wave.float()[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=N_FFT, window=torch.hann_window(N_FFT, device=y.device),
                      center=False, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log((_MELS.to(y.device) @ mag).clamp(min=1e-5))[0].T


def _conv(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class Tdnn(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """The channels in `scale` groups; group i > 0 goes through its TDNN after adding group i - 1's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(Tdnn(channels // scale, channels // scale, kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        for i, block in enumerate(self.blocks, start=1):
            out.append(block(parts[i] if i == 1 else parts[i] + out[-1]))
        return torch.cat(out, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = _conv(channels, squeeze), _conv(squeeze, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))


class SeRes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, squeeze: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = Tdnn(cin, cout)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = Tdnn(cout, cout)
        self.se_block = SqueezeExcite(cout, squeeze)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _stats(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = (weights * x).sum(2)
    return mean, torch.sqrt((weights * (x - mean[..., None]).pow(2)).sum(2).clamp(min=1e-12))


class AttentivePooling(nn.Module):
    """Attention over time from each frame and the global mean and std; returns the weighted mean and std."""

    def __init__(self, channels: int, attention: int) -> None:
        super().__init__()
        self.tdnn = Tdnn(channels * 3, attention)
        self.conv = _conv(attention, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        mean, std = _stats(x, torch.full_like(x[:, :1], 1.0 / t))
        context = torch.cat((x, mean[..., None].expand(-1, -1, t), std[..., None].expand(-1, -1, t)), dim=1)
        weights = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _stats(x, weights)
        return torch.cat((mean, std), dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        ch, ks, dil = cfg["enc_channels"], cfg["enc_kernel_sizes"], cfg["enc_dilations"]
        if not len(ch) == len(ks) == len(dil):
            raise ValueError("speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations differ")
        self.blocks = nn.ModuleList([Tdnn(cfg["mel_dim"], ch[0], ks[0], dil[0])])
        self.blocks.extend(SeRes2NetBlock(ch[i - 1], ch[i], cfg["enc_res2net_scale"], cfg["enc_se_channels"], ks[i],
                                          dil[i]) for i in range(1, len(ch) - 1))
        self.mfa = Tdnn(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentivePooling(ch[-1], cfg["enc_attention_channels"])
        self.fc = _conv(ch[-1] * 2, cfg["enc_dim"])

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """mels [B, frames, 128] -> x-vectors [B, enc_dim]."""
        x, outs = mels.transpose(1, 2), []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        return self.fc(self.asp(self.mfa(torch.cat(outs[1:], dim=1))))[..., 0]

    def embed(self, wave: torch.Tensor) -> torch.Tensor:
        """Mono reference audio [T] at 24 kHz -> its x-vector [enc_dim]."""
        p = next(self.parameters())
        return self(log_mel(wave.to(p.device))[None].to(p.dtype))[0]
