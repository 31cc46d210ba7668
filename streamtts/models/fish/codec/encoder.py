"""Firefly encode path for voice references: audio -> codes ``[8, T]`` (spec §5.3-5.5, §5.9).

Any-rate, any-channel audio is mixed to mono and resampled to 44.1 kHz (soxr), then log-mel ->
ConvNeXt encoder -> 4x downsampler -> grouped FSQ. Runs in fp32 without autocast.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr
import torch
from torch import Tensor, nn

from streamtts.models.fish.codec.blocks import LAYER_NORM_EPS, CausalConv1d, ConvNeXtBlock
from streamtts.models.fish.codec.config import EncoderConfig, QuantizerConfig, VocoderConfig
from streamtts.models.fish.codec.fsq import FsqEncoder
from streamtts.models.fish.codec.mel import LogMelSpectrogram

DOWNSAMPLER_KERNEL_SIZE = 7  # ConvNeXt depthwise kernel in the quantizer's downsampler
# Upstream stages are Sequential(conv, ConvNeXtBlock): child "0" / "1" -> our names.
_DOWN_STAGE_LAYERS = {"0": "down", "1": "block"}


class ChannelsFirstLayerNorm(nn.Module):
    """LayerNorm over C of [B, C, T]: ``(x - mean) / sqrt(biased var + eps) * w + b``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=1, keepdim=True)  # [B, 1, T]
        var = (x - mean).square().mean(dim=1, keepdim=True)  # [B, 1, T]
        x = (x - mean) / torch.sqrt(var + LAYER_NORM_EPS)
        return self.weight[:, None] * x + self.bias[:, None]


class ConvNeXtEncoder(nn.Module):
    """Log-mel [B, n_mels, M] -> features [B, dims[-1], M]."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        dims = cfg.dims
        stem = nn.ModuleList(
            [
                CausalConv1d(cfg.input_channels, dims[0], cfg.kernel_size),
                ChannelsFirstLayerNorm(dims[0]),
            ]
        )
        self.downsample_layers = nn.ModuleList([stem])
        for i in range(1, len(dims)):
            self.downsample_layers.append(
                nn.ModuleList(
                    [ChannelsFirstLayerNorm(dims[i - 1]), nn.Conv1d(dims[i - 1], dims[i], 1)]
                )
            )
        self.stages = nn.ModuleList(
            nn.ModuleList(ConvNeXtBlock(dim, cfg.kernel_size) for _ in range(depth))
            for dim, depth in zip(dims, cfg.depths, strict=True)
        )
        self.norm = ChannelsFirstLayerNorm(dims[-1])

    def forward(self, x: Tensor) -> Tensor:
        for down, stage in zip(self.downsample_layers, self.stages, strict=True):
            assert isinstance(down, nn.ModuleList) and isinstance(stage, nn.ModuleList)
            for layer in down:
                x = layer(x)
            for block in stage:
                x = block(x)
        x = self.norm(x)
        return x


class DownsampleStage(nn.Module):
    """[B, C, T] -> [B, C, ceil(T / factor)]: causal conv (k = stride = factor) + ConvNeXt."""

    def __init__(self, dim: int, factor: int) -> None:
        super().__init__()
        self.down = CausalConv1d(dim, dim, factor, stride=factor)
        self.block = ConvNeXtBlock(dim, DOWNSAMPLER_KERNEL_SIZE)

    def forward(self, x: Tensor) -> Tensor:
        x = self.block(self.down(x))
        return x


class Downsampler(nn.Module):
    """[B, C, M] -> [B, C, ceil(M / prod(factors))]."""

    def __init__(self, cfg: QuantizerConfig) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            DownsampleStage(cfg.input_dim, factor) for factor in cfg.downsample_factor
        )

    def forward(self, x: Tensor) -> Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


class FireflyEncoder(nn.Module):
    """Waveform [B, L] at 44.1 kHz -> indices [B, G, ceil(ceil(L // hop / 2) / 2)] (int32)."""

    def __init__(self, cfg: VocoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.backbone = ConvNeXtEncoder(cfg.encoder)
        self.downsample = Downsampler(cfg.quantizer)
        q = cfg.quantizer
        self.fsq = FsqEncoder(q.input_dim, q.n_groups, q.levels)
        self.spectrogram = LogMelSpectrogram(cfg.mel)

    def latent(self, audio: Tensor) -> Tensor:
        """[B, L] -> pre-quantisation latent [B, C, T] at the code rate."""
        feats = self.backbone(self.spectrogram(audio))  # [B, C, M]
        z: Tensor = self.downsample(feats)  # [B, C, T]
        return z

    def forward(self, audio: Tensor) -> Tensor:
        with torch.autocast(audio.device.type, enabled=False):
            indices: Tensor = self.fsq(self.latent(audio.float()))  # [B, G, T]
        return indices


def encoder_key(key: str) -> str | None:
    """Upstream generator key -> :class:`FireflyEncoder` key, or None if not an encoder weight."""
    if key.startswith("backbone."):
        return key
    if key.startswith("quantizer.downsample."):
        stage, layer, tail = key.removeprefix("quantizer.downsample.").split(".", 2)
        return f"downsample.stages.{stage}.{_DOWN_STAGE_LAYERS[layer]}.{tail}"
    if key.startswith("quantizer.residual_fsq.rvqs.") and ".project_in." in key:
        group = key.removeprefix("quantizer.residual_fsq.rvqs.").split(".", 1)[0]
        return f"fsq.project_in.{group}.{key.rsplit('.', 1)[1]}"
    return None


def to_codec_input(audio: npt.ArrayLike, sample_rate: int, target_rate: int) -> Tensor:
    """Any audio -> mono fp32 [L] at ``target_rate`` Hz.

    ``audio``: ``[L]`` or ``[L, channels]`` (soundfile's layout), float or *signed* integer
    PCM (scaled to [-1, 1)). Channels are averaged, then resampled with soxr.
    """
    x = np.asarray(audio)
    if np.issubdtype(x.dtype, np.unsignedinteger):
        raise ValueError("unsigned integer PCM is not supported")
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / float(np.iinfo(x.dtype).max + 1)
    x = x.astype(np.float32, copy=False)
    if x.ndim == 2:
        x = x.mean(axis=1)
    elif x.ndim != 1:
        raise ValueError(f"expected [samples] or [samples, channels], got shape {x.shape}")
    if sample_rate != target_rate:
        x = np.asarray(soxr.resample(x, sample_rate, target_rate), dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(x))


@torch.inference_mode()
def encode_reference(encoder: FireflyEncoder, audio: npt.ArrayLike, sample_rate: int) -> Tensor:
    """Reference audio (any rate / channels) -> codes [G, T] int32 on the encoder's device."""
    device = next(encoder.parameters()).device
    wave = to_codec_input(audio, sample_rate, encoder.config.sample_rate).to(device)  # [L]
    if wave.numel() < encoder.config.mel.win_length:
        raise ValueError("reference audio is shorter than one STFT window")
    indices: Tensor = encoder(wave[None])[0]
    return indices
