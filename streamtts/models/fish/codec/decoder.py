"""Firefly decode path: codes ``[B, 8, N]`` -> waveform ``[B, 1, N * 2048]`` (spec §5.6).

FSQ lookup -> 4x upsampler (causal transposed conv k2 s2 + ConvNeXt block, twice) -> HiFi-GAN
head (causal conv_pre, five SiLU + transposed conv + ParallelBlock stages, SiLU + conv_post)
-> tanh. Every layer is causal, so with a :class:`LeftContext` the same modules decode a stream
chunk by chunk with output identical to a one-shot decode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamtts.models.fish.codec.blocks import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock
from streamtts.models.fish.codec.config import HeadConfig, QuantizerConfig, VocoderConfig
from streamtts.models.fish.codec.conv_state import LeftContext, assign_context_slots, is_time_major
from streamtts.models.fish.codec.fsq import FsqDecoder

UPSAMPLER_KERNEL_SIZE = 7  # ConvNeXt depthwise kernel in the quantizer's up/downsampler
# Upstream stages are Sequential(conv, ConvNeXtBlock): child "0" / "1" -> our names.
_UP_STAGE_LAYERS = {"0": "up", "1": "block"}


class ResBlock1(nn.Module):
    """Three ``x += conv2(silu(conv1(silu(x))))`` pairs; *both* convs use dilation ``d_j``."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            CausalConv1d(channels, channels, kernel_size, dilation=d) for d in dilations
        )
        self.convs2 = nn.ModuleList(
            CausalConv1d(channels, channels, kernel_size, dilation=d) for d in dilations
        )

    def forward(
        self, x: Tensor, ctx: LeftContext | None = None, silu_x: Tensor | None = None
    ) -> Tensor:
        """x [B, C, T] -> [B, C, T]; ``silu_x``: ``F.silu(x)`` if the caller has it already."""
        for conv1, conv2 in zip(self.convs1, self.convs2, strict=True):
            activated = F.silu(x) if silu_x is None else silu_x
            silu_x = None
            x = conv2(conv1(activated, ctx, silu=True), ctx, residual=x)
        return x


class ParallelBlock(nn.Module):
    """Mean of ResBlock1 with kernel sizes 3, 7, 11 applied to the same input."""

    def __init__(
        self,
        channels: int,
        kernel_sizes: tuple[int, ...],
        dilations: tuple[tuple[int, ...], ...],
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            ResBlock1(channels, k, d) for k, d in zip(kernel_sizes, dilations, strict=True)
        )

    def forward(self, x: Tensor, ctx: LeftContext | None = None) -> Tensor:
        """x [B, C, T] -> [B, C, T]."""
        silu_x = F.silu(x)  # every block starts from it
        outs: list[Tensor] = [block(x, ctx, silu_x) for block in self.blocks]
        if is_time_major(x):  # the packed path: a mean that keeps the layout
            total = outs[0].float()
            for out in outs[1:]:
                total = total + out
            return (total / len(outs)).to(x.dtype)
        return torch.stack(outs, dim=0).mean(dim=0)


class HiFiGANHead(nn.Module):
    """Latent at mel-frame rate [B, num_mels, M] -> waveform [B, 1, M * hop_length] in (-1, 1)."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        ch = cfg.upsample_initial_channel
        self.conv_pre = CausalConv1d(cfg.num_mels, ch, cfg.pre_conv_kernel_size)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (rate, kernel) in enumerate(
            zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True)
        ):
            c_in, c_out = ch >> i, ch >> (i + 1)
            self.ups.append(CausalConvTranspose1d(c_in, c_out, kernel, rate))
            self.resblocks.append(
                ParallelBlock(c_out, cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes)
            )
        self.conv_post = CausalConv1d(ch >> len(self.ups), 1, cfg.post_conv_kernel_size)

    def forward(self, x: Tensor, ctx: LeftContext | None = None) -> Tensor:
        x = self.conv_pre(x, ctx)  # [B, ch, M]
        for up, resblock in zip(self.ups, self.resblocks, strict=True):
            x = up(F.silu(x), ctx)  # [B, ch_i, M * prod(rates[:i+1])]
            x = resblock(x, ctx)
        x = self.conv_post(F.silu(x), ctx)  # [B, 1, M * hop]
        return torch.tanh(x)


class UpsampleStage(nn.Module):
    """[B, C, T] -> [B, C, T * factor]: causal transposed conv (k = s = factor) + ConvNeXt."""

    def __init__(self, dim: int, factor: int) -> None:
        super().__init__()
        self.up = CausalConvTranspose1d(dim, dim, factor, factor)
        self.block = ConvNeXtBlock(dim, UPSAMPLER_KERNEL_SIZE)

    def forward(self, x: Tensor, ctx: LeftContext | None = None) -> Tensor:
        x = self.block(self.up(x, ctx), ctx)
        return x


class Upsampler(nn.Module):
    """Code-rate latent [B, C, N] -> mel-frame-rate latent [B, C, N * prod(factors)]."""

    def __init__(self, cfg: QuantizerConfig) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            UpsampleStage(cfg.input_dim, factor) for factor in reversed(cfg.downsample_factor)
        )

    def forward(self, x: Tensor, ctx: LeftContext | None = None) -> Tensor:
        for stage in self.stages:
            x = stage(x, ctx)
        return x


class FireflyDecoder(nn.Module):
    """Codes [B, G, N] -> waveform [B, 1, N * samples_per_code].

    State-dict names (after :func:`decoder_key`): ``fsq.project_out.{g}``, ``upsample.*``,
    ``head.*``. After changing weights call :meth:`refresh` (rebuilds the FSQ table).
    """

    def __init__(self, cfg: VocoderConfig) -> None:
        super().__init__()
        q = cfg.quantizer
        self.config = cfg
        self.fsq = FsqDecoder(q.input_dim, q.n_groups, q.levels)
        self.upsample = Upsampler(q)
        self.head = HiFiGANHead(cfg.head)
        # (channels, columns) of the cached left context of each causal layer, by slot.
        self.context_shapes = assign_context_slots(self)
        self.refresh()

    def refresh(self) -> None:
        self.fsq.refresh_table()

    def latent(self, codes: Tensor, ctx: LeftContext | None = None) -> Tensor:
        """codes [B, G, N] -> upsampled latent [B, C, N * mel_frames_per_code]."""
        z: Tensor = self.fsq(codes)  # [B, C, N]
        z = self.upsample(z, ctx)  # [B, C, N * 4]
        return z

    def forward(self, codes: Tensor, ctx: LeftContext | None = None) -> Tensor:
        """codes [B, G, N] -> audio [B, 1, N * samples_per_code]."""
        y: Tensor = self.head(self.latent(codes, ctx), ctx)
        return y


def decoder_key(key: str) -> str | None:
    """Upstream generator key -> :class:`FireflyDecoder` key, or None if not a decoder weight."""
    if key.startswith("head."):
        return key
    if key.startswith("quantizer.upsample."):
        rest = key.removeprefix("quantizer.upsample.")
        stage, layer, tail = rest.split(".", 2)
        return f"upsample.stages.{stage}.{_UP_STAGE_LAYERS[layer]}.{tail}"
    if key.startswith("quantizer.residual_fsq.rvqs.") and ".project_out." in key:
        group = key.removeprefix("quantizer.residual_fsq.rvqs.").split(".", 1)[0]
        return f"fsq.project_out.{group}.{key.rsplit('.', 1)[1]}"
    return None
