"""Causal building blocks shared by the Firefly encoder and decoder (spec §5.2).

Every layer takes an optional :class:`LeftContext`: without it, the left side is zero padded
(decoding from scratch, upstream's behaviour); with it, the cached columns of earlier chunks are
used instead, which makes chunk-by-chunk decoding equal to decoding everything at once.
Weights are held in plain ``nn.Conv1d`` / ``nn.Linear`` modules so the state-dict names match
upstream; padding is done here.

On a CPU with oneDNN bf16 kernels a bf16 decoder may ``pack_`` its layers, and on any CPU
with oneDNN an fp32 one (``dtype auto`` or ``int8`` where the CPU has no native bf16). Packed
convolutions hold their weights in oneDNN's blocked layout (``F.conv1d`` reorders the plain
weight on every call) and fuse the SiLU after them and the residual sum; their activations are
*time-major*: a logical ``[B, C, T]`` tensor stored as ``[B, T, C]`` (oneDNN's channels-last),
which runs the 16- to 64-channel audio-rate convolutions about twice as fast as ``[B, C, T]``
storage. The layout only changes strides: every op here keeps working on the logical shape.
A packed layer no longer holds its plain weight (72 MB of the fp32 decoder); its parameter
stays as an empty placeholder, so the module's parameters still tell its dtype and device and
any plain use of the weight fails loudly.
Packed kernels sum in another order, so results move by a rounding (bf16 has no bit-exact
reference; explicit fp32, the parity mode, is never packed). On the 2-core dev CPU a streamed
8-frame chunk went from 6.1 to 4.5 ms per frame in bf16; in fp32 on a Zen 3, 23.6 to 18.2 ms.

With the fused ops' library loaded on a CPU with AVX512-BF16, a bf16 stride-1 convolution of
fitting shape may instead ``pack_rows_``: its weight in the conv pairs layout for
``streamtts_fused::row_conv`` (``models/fish/fused/csrc/row_conv.cpp``), which rounds as the
plain module does (the convolution, then SiLU, then the residual sum) and sums each output in
one order whatever the chunk, so chunked decoding gives the one-shot bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamtts.models.fish.codec.conv_state import LeftContext, is_time_major

LAYER_NORM_EPS = 1e-6
CONV_BLOCK = 16  # outputs per block of the conv pairs layout (csrc/row_conv.cpp: kLanes)


def conv_pairs_fit(conv: nn.Conv1d) -> bool:
    """Whether ``conv`` can take the conv pairs layout: bf16, dense, stride 1, an even number of
    inputs and whole blocks of outputs."""
    out_channels, in_channels, _ = conv.weight.shape
    return (
        conv.weight.dtype == torch.bfloat16
        and conv.groups == 1
        and conv.stride == (1,)
        and in_channels % 2 == 0
        and out_channels % CONV_BLOCK == 0
    )


def pack_conv_pairs(weight: Tensor) -> Tensor:
    """[C_out, C_in, K] → [C_out/16, K, C_in/2, 16, 2]: per block of 16 outputs, tap and input
    pair j, the outputs' (w[o, 2j, k], w[o, 2j+1, k]), contiguous."""
    c_out, c_in, taps = weight.shape
    blocks = weight.reshape(c_out // CONV_BLOCK, CONV_BLOCK, c_in // 2, 2, taps)
    return blocks.permute(0, 4, 2, 1, 3).contiguous()


class CausalConv1d(nn.Module):
    """Conv1d padded ``K - stride`` on the left (``K`` = dilated kernel), bias included.

    Upstream's "FishConvNet". One-shot calls also right-pad the minimum needed so the last
    strided window is complete; streaming calls require stride 1.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(
            in_channels, out_channels, kernel_size, stride, dilation=dilation, groups=groups
        )
        self.in_channels = in_channels
        self.stride = stride
        self.dilation = dilation
        self.groups = groups
        self.context_width = (kernel_size - 1) * dilation + 1 - stride
        self.context_slot = -1
        self.packed: Tensor | None = None  # [C_out, C_in / groups, 1, K] in oneDNN's layout
        self.row_packed: Tensor | None = None  # [C_out/16, K, C_in/2, 16, 2] (row_conv)
        self.row_bias: Tensor | None = None  # [C_out] fp32: the kernel adds it in fp32 anyway

    def pack_rows_(self) -> bool:
        """Hold the weight in the conv pairs layout for ``streamtts_fused::row_conv`` where it
        fits (:func:`conv_pairs_fit`); returns whether it does. The caller has loaded the fused
        library and checked the CPU (``why_not_paired`` in ``models/fish/fused/pairs.py``)."""
        if self.row_packed is None and self.packed is None and conv_pairs_fit(self.conv):
            self.row_packed = pack_conv_pairs(self.conv.weight.detach())
            if self.conv.bias is not None:  # widened once here, not at every call
                self.row_bias = self.conv.bias.detach().float()
            _release_plain_weight(self.conv)
        return self.row_packed is not None

    def pack_(self, typical_columns: int = 256) -> None:
        """Hold the weight in oneDNN's blocked layout from now on (CPU; see the module doc).

        oneDNN convolves 2-D, so the weight gets a unit height; ``typical_columns`` only
        guides the choice of blocking, any length is accepted afterwards. Packing twice is
        packing once (the plain weight is gone after the first).
        """
        if self.packed is not None or self.row_packed is not None:
            return
        weight = self.conv.weight.detach().unsqueeze(2)  # [C_out, C_in / groups, 1, K]
        input_size = [1, self.in_channels, 1, typical_columns]
        self.packed = torch.ops.mkldnn._reorder_convolution_weight(
            weight, [0, 0], [1, self.stride], [1, self.dilation], self.groups, input_size
        )
        _release_plain_weight(self.conv)

    def forward(
        self,
        x: Tensor,
        ctx: LeftContext | None = None,
        *,
        silu: bool = False,
        residual: Tensor | None = None,
    ) -> Tensor:
        """x [B, C_in, T] -> [B, C_out, ceil(T / stride)], then SiLU if ``silu``, then plus
        ``residual`` [B, C_out, T_out] if given (both fused into the packed kernel)."""
        if ctx is None:
            extra = -x.shape[-1] % self.stride  # right pad to complete the last window
            xp = F.pad(x, (self.context_width, extra))
        else:
            assert self.stride == 1, "streaming needs stride 1"
            xp = ctx.extend(self.context_slot, x)  # [B, C_in, W + T]
        if self.row_packed is not None:
            return self._row_forward(xp, silu, residual)
        if self.packed is not None:
            return self._packed_forward(xp, silu, residual)
        w, b = self.conv.weight, self.conv.bias
        y = F.conv1d(xp, w, b, self.stride, 0, self.dilation, self.groups)
        y = F.silu(y) if silu else y
        return y if residual is None else residual + y

    def _row_forward(self, xp: Tensor, silu: bool, residual: Tensor | None) -> Tensor:
        rows = xp.transpose(1, 2)  # [B, W + T, C_in], contiguous where xp is time-major
        y: Tensor = torch.ops.streamtts_fused.row_conv(
            rows,
            self.row_packed,
            self.row_bias,
            self.dilation,
            silu,
            None if residual is None else residual.transpose(1, 2),
        )  # [B, T_out, C_out]
        return y.transpose(1, 2)  # [B, C_out, T_out], time-major

    def _packed_forward(self, xp: Tensor, silu: bool, residual: Tensor | None) -> Tensor:
        geometry = ([0, 0], [1, self.stride], [1, self.dilation], self.groups)
        x4 = _channels_last(xp)  # [B, C_in, 1, W + T]
        unary = "swish" if silu else "none"
        if residual is None:
            y = torch.ops.mkldnn._convolution_pointwise(
                x4, self.packed, self.conv.bias, *geometry, unary, [], ""
            )
        else:
            # oneDNN would apply a unary op after the sum, not before it as defined here.
            assert not silu, "silu and residual together are not fused"
            y = torch.ops.mkldnn._convolution_pointwise.binary(
                x4,
                _channels_last(residual),
                self.packed,
                self.conv.bias,
                *geometry,
                "add",
                None,
                None,
                [],
                None,
            )
        out: Tensor = y.squeeze(2)  # [B, C_out, T_out], time-major
        return out


def _release_plain_weight(conv: nn.Conv1d | nn.ConvTranspose1d) -> None:
    """Replace a packed layer's plain weight by an empty placeholder of its dtype and device
    (see the module doc)."""
    conv.weight = nn.Parameter(conv.weight.detach().new_empty(0), requires_grad=False)


def _channels_last(x: Tensor) -> Tensor:
    """[B, C, T] -> a [B, C, 1, T] view in oneDNN's channels-last layout (a copy if needed)."""
    x4 = x.unsqueeze(2)
    if is_time_major(x):
        return x4
    return x4.contiguous(memory_format=torch.channels_last)


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d(k, s) with the last ``k - s`` outputs dropped: T inputs -> T * s outputs.

    Output block ``t`` depends on inputs ``t - ceil(k/s) + 1 .. t``, so streaming keeps the last
    ``ceil(k/s) - 1`` *input* columns (one for k = 2s, none for k = s) and recomputes their
    overlap instead of storing partial output sums: that stays exact when a ragged batch has
    junk columns after a stream's valid ones.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.context_width = -(-kernel_size // stride) - 1
        self.context_slot = -1
        self.packed: Tensor | None = None  # [C_out * k, C_in] in oneDNN's layout

    def pack_(self) -> None:
        """Hold the overlap-add product's weight in oneDNN's blocked layout (CPU); a kernel that
        is no multiple of the stride keeps torch's kernel and its plain weight. Packing twice
        is packing once."""
        if self.kernel_size % self.stride or self.packed is not None:
            return
        weight = self.conv.weight.detach()  # [C_in, C_out, k]
        flat_t = weight.reshape(weight.shape[0], -1).t().contiguous()  # [C_out * k, C_in]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(flat_t, 1)
        _release_plain_weight(self.conv)

    def forward(self, x: Tensor, ctx: LeftContext | None = None) -> Tensor:
        """x [B, C_in, T] -> [B, C_out, T * stride]."""
        width = self.context_width
        if ctx is None:
            xp = F.pad(x, (width, 0))  # [B, C_in, W + T]
        else:
            xp = ctx.extend(self.context_slot, x) if width else x
        if self.kernel_size % self.stride:
            y = F.conv_transpose1d(xp, self.conv.weight, self.conv.bias, self.stride)
            return y[:, :, width * self.stride : (width + x.shape[-1]) * self.stride]
        return self._overlap_add(xp, x.shape[-1])

    def _overlap_add(self, xp: Tensor, frames: int) -> Tensor:
        """Transposed conv for ``k = R * s`` as one matmul plus an R-term overlap-add.

        Input column ``i`` writes ``R`` blocks of ``s`` samples to output blocks ``i .. i+R-1``,
        so output block ``t`` sums block ``r`` of input ``t - r``. (torch's CPU kernel for
        ConvTranspose1d is im2col-based and several times slower at these shapes.)
        """
        batch, c_in, _ = xp.shape
        bias = self.conv.bias  # [C_out]
        c_out, kernel = self.out_channels, self.kernel_size
        stride, reps = self.stride, kernel // self.stride
        if self.packed is None:
            flat = self.conv.weight.reshape(c_in, c_out * kernel)  # [C_in, C_out * k]
            blocks = torch.matmul(xp.transpose(1, 2), flat)  # [B, W + T, C_out * k]
        else:
            blocks = torch.ops.mkldnn._linear_pointwise(
                xp.transpose(1, 2), self.packed, None, "none", [], ""
            )
        blocks = blocks.view(batch, -1, c_out, reps, stride)  # [B, W + T, C_out, R, s]
        width = reps - 1
        y = blocks[:, width : width + frames, :, 0]  # [B, T, C_out, s]
        for r in range(1, reps):
            y = y + blocks[:, width - r : width - r + frames, :, r]
        if self.packed is None:
            y = y.permute(0, 2, 1, 3).reshape(batch, c_out, frames * stride)  # [B, C_out, T * s]
        else:  # the same [B, C_out, T * s], time-major for the packed convolutions after it
            y = y.transpose(2, 3).reshape(batch, frames * stride, c_out).transpose(1, 2)
        if bias is not None:
            y = y + bias[:, None]
        return y


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv -> LayerNorm -> MLP (GELU) -> layer scale, plus the residual."""

    def __init__(self, dim: int, kernel_size: int = 7, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.pwconv1 = nn.Linear(dim, mlp_ratio * dim)
        self.pwconv2 = nn.Linear(mlp_ratio * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))  # layer scale

    def forward(self, x: Tensor, ctx: LeftContext | None = None) -> Tensor:
        """x [B, C, T] -> [B, C, T]."""
        y: Tensor = self.dwconv(x, ctx).transpose(1, 2)  # [B, T, C]
        y = self.norm(y)
        y = self.pwconv2(F.gelu(self.pwconv1(y)))  # [B, T, C]
        y = (self.gamma * y).transpose(1, 2)  # [B, C, T]
        return x + y
