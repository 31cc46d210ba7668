"""Log-mel spectrogram of the Firefly encoder (spec §5.3), with a Slaney mel filterbank.

Reflect-pad ``(win - hop) // 2`` / ``(win - hop + 1) // 2`` samples, STFT (periodic Hann,
``center=False``), magnitude ``sqrt(re^2 + im^2 + 1e-6)``, Slaney-normalised triangular mel
filters on the Slaney mel scale, ``ln(max(mel, 1e-5))``. Frames = ``floor(L / hop)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from streamtts.models.fish.codec.config import MelConfig

MAGNITUDE_EPS = 1e-6  # added to re^2 + im^2 before the square root
LOG_FLOOR = 1e-5  # mel energies are clamped here before ln

# Slaney mel scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above.
_SLANEY_HZ_PER_MEL = 200.0 / 3.0  # Hz
_SLANEY_BREAK_HZ = 1000.0  # Hz
_SLANEY_BREAK_MEL = _SLANEY_BREAK_HZ / _SLANEY_HZ_PER_MEL  # 15 mel
_SLANEY_LOG_STEP = math.log(6.4) / 27.0  # ln(Hz ratio) per mel above the break


def hz_to_slaney_mel(hz: Tensor) -> Tensor:
    linear = hz / _SLANEY_HZ_PER_MEL
    log = _SLANEY_BREAK_MEL + torch.log(hz.clamp(min=_SLANEY_BREAK_HZ) / _SLANEY_BREAK_HZ) / (
        _SLANEY_LOG_STEP
    )
    return torch.where(hz >= _SLANEY_BREAK_HZ, log, linear)


def slaney_mel_to_hz(mel: Tensor) -> Tensor:
    linear = mel * _SLANEY_HZ_PER_MEL
    log = _SLANEY_BREAK_HZ * torch.exp(
        _SLANEY_LOG_STEP * (mel.clamp(min=_SLANEY_BREAK_MEL) - _SLANEY_BREAK_MEL)
    )
    return torch.where(mel >= _SLANEY_BREAK_MEL, log, linear)


def slaney_mel_filterbank(
    n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int
) -> Tensor:
    """Triangular filters with Slaney area normalisation -> [n_freqs, n_mels] fp32.

    Filter ``m`` rises from edge ``m`` to ``m + 1`` and falls to ``m + 2`` of ``n_mels + 2``
    edges equally spaced in mel, and is scaled by ``2 / (f[m + 2] - f[m])`` (unit area).
    """
    dt = torch.float64
    bin_hz = torch.linspace(0.0, sample_rate / 2, n_freqs, dtype=dt, device="cpu")  # [F]
    mel_lo, mel_hi = hz_to_slaney_mel(torch.tensor([f_min, f_max], dtype=dt, device="cpu"))
    edges_hz = slaney_mel_to_hz(
        torch.linspace(float(mel_lo), float(mel_hi), n_mels + 2, dtype=dt, device="cpu")
    )
    widths = edges_hz[1:] - edges_hz[:-1]  # [n_mels + 1]
    offsets = edges_hz[None, :] - bin_hz[:, None]  # [F, n_mels + 2]
    rising = -offsets[:, :-2] / widths[:-1]  # [F, n_mels]
    falling = offsets[:, 2:] / widths[1:]  # [F, n_mels]
    bank = torch.clamp(torch.minimum(rising, falling), min=0.0)
    bank = bank * (2.0 / (edges_hz[2:] - edges_hz[:-2]))[None, :]
    return bank.to(torch.float32)


class LogMelSpectrogram:
    """Waveform [B, L] at ``cfg.sample_rate`` -> log-mel [B, n_mels, L // hop] (fp32)."""

    def __init__(self, cfg: MelConfig) -> None:
        self.cfg = cfg
        n_freqs = cfg.n_fft // 2 + 1
        self.filterbank = slaney_mel_filterbank(  # [F, n_mels]
            n_freqs, 0.0, cfg.sample_rate / 2, cfg.n_mels, cfg.sample_rate
        )
        self.window = torch.hann_window(cfg.win_length, periodic=True, device="cpu")  # [win]

    def magnitude(self, audio: Tensor) -> Tensor:
        """[B, L] -> linear magnitude [B, n_fft // 2 + 1, L // hop]."""
        cfg = self.cfg
        pad_left = (cfg.win_length - cfg.hop_length) // 2
        pad_right = (cfg.win_length - cfg.hop_length + 1) // 2
        padded = F.pad(audio[:, None, :], (pad_left, pad_right), mode="reflect")[:, 0]
        spec = torch.stft(
            padded,
            cfg.n_fft,
            hop_length=cfg.hop_length,
            win_length=cfg.win_length,
            window=self.window.to(audio.device),
            center=False,
            onesided=True,
            return_complex=True,
        )  # [B, F, frames]
        return torch.sqrt(spec.real.square() + spec.imag.square() + MAGNITUDE_EPS)

    def __call__(self, audio: Tensor) -> Tensor:
        mag = self.magnitude(audio.float())  # [B, F, T]
        mel = torch.matmul(mag.transpose(1, 2), self.filterbank.to(mag.device))  # [B, T, M]
        return torch.log(torch.clamp(mel, min=LOG_FLOOR)).transpose(1, 2)  # [B, M, T]
