"""The bf16 vocoder's convolutions by ``row_conv``: the plain module's roundings, one sum order
whatever the chunk, every tile shape; and the decoder built on it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from streamtts.fish.load import synthetic_codec
from streamtts.models.fish.codec.blocks import CausalConv1d, pack_conv_pairs
from streamtts.models.fish.codec.incremental import IncrementalDecoder
from streamtts.models.fish.fused.pairs import why_not_paired
from tests.models.fish.bf16 import bf16_step

pytestmark = pytest.mark.usefixtures("fused_library")

# (channels, taps, dilation, new columns): 4, 2 and 1 blocks of outputs a tile (64·n, 32·odd,
# 16·odd channels), time steps no multiple of a tile's, the vocoder's kernels and dilations.
SHAPES = [(64, 11, 5, 50), (96, 7, 3, 37), (48, 3, 1, 101), (16, 13, 1, 9), (256, 3, 1, 5)]


@pytest.fixture(autouse=True, scope="module")
def row_conv_cpu(fused_library: None) -> None:
    if (why_not := why_not_paired()) is not None:
        pytest.skip(why_not)


def conv_case(
    channels: int, taps: int, dilation: int, columns: int, seed: int, batch: int = 2
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, Tin, C] time-major rows, weight [C, C, K], bias [C], residual [B, T, C], bf16."""
    gen = torch.Generator().manual_seed(seed)
    t_in = columns + (taps - 1) * dilation
    x = torch.randn(batch, t_in, channels, generator=gen).bfloat16()
    weight = (
        torch.randn(channels, channels, taps, generator=gen) / (channels * taps) ** 0.5
    ).bfloat16()
    bias = torch.randn(channels, generator=gen).bfloat16()
    residual = torch.randn(batch, columns, channels, generator=gen).bfloat16()
    return x, weight, bias, residual


def row_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    silu: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    out: torch.Tensor = torch.ops.streamtts_fused.row_conv(
        x, pack_conv_pairs(weight), bias, dilation, silu, residual
    )
    return out


@pytest.mark.parametrize(("channels", "taps", "dilation", "columns"), SHAPES)
def test_the_sums_are_the_convolution_rounded_once(
    channels: int, taps: int, dilation: int, columns: int
) -> None:
    """Within one bf16 step of the exact (fp32) convolution, and nearly always ATen's bf16."""
    x, weight, bias, _ = conv_case(channels, taps, dilation, columns, seed=channels)
    got = row_conv(x, weight, bias, dilation)  # [B, T, C]
    assert got.shape == (2, columns, channels) and got.dtype == torch.bfloat16
    exact = F.conv1d(x.transpose(1, 2).float(), weight.float(), bias.float(), dilation=dilation)
    exact = exact.transpose(1, 2)
    assert ((got.float() - exact).abs() <= bf16_step(exact)).all()
    aten = F.conv1d(x.transpose(1, 2), weight, bias, dilation=dilation).transpose(1, 2)
    assert (got == aten).float().mean() >= 0.97


@pytest.mark.parametrize(("channels", "taps", "dilation", "columns"), SHAPES)
def test_silu_and_the_residual_round_as_the_plain_module(
    channels: int, taps: int, dilation: int, columns: int
) -> None:
    """SiLU of the rounded convolution, rounded (its own e^x: at most one step off, rarely);
    the residual plus the rounded convolution, rounded as ATen adds: the same bits."""
    x, weight, bias, residual = conv_case(channels, taps, dilation, columns, seed=channels + 1)
    plain = row_conv(x, weight, bias, dilation)
    activated = row_conv(x, weight, bias, dilation, silu=True)
    want = F.silu(plain)
    assert ((activated.float() - want.float()).abs() <= bf16_step(want.float())).all()
    assert (activated == want).float().mean() >= 0.999
    summed = row_conv(x, weight, bias, dilation, residual=residual)
    assert torch.equal(summed, residual + plain)


@pytest.mark.parametrize(("channels", "taps", "dilation", "columns"), SHAPES)
def test_any_span_of_columns_gets_the_same_bits(
    channels: int, taps: int, dilation: int, columns: int
) -> None:
    """Columns computed from a part of the input (a later chunk with its left context) equal
    those of the whole: each output's sum runs in one order."""
    x, weight, bias, _ = conv_case(channels, taps, dilation, columns, seed=channels + 2)
    whole = row_conv(x, weight, None, dilation)
    field = (taps - 1) * dilation
    for first, last in ((0, 1), (3, columns), (columns // 2, columns)):
        part = row_conv(x[:, first : last + field], weight, None, dilation)
        assert torch.equal(part, whole[:, first:last]), (first, last)
    alone = row_conv(x[1:], weight, None, dilation)  # a batch row alone
    assert torch.equal(alone, whole[1:])


def test_it_refuses_what_it_cannot_convolve() -> None:
    x, weight, bias, _ = conv_case(32, 3, 1, 4, seed=0)
    packed = pack_conv_pairs(weight)
    op = torch.ops.streamtts_fused.row_conv
    with pytest.raises(RuntimeError, match="channels"):
        op(x[..., :16], packed, bias, 1, False, None)
    with pytest.raises(RuntimeError, match="receptive field"):
        op(x[:, :1], packed, bias, 1, False, None)
    with pytest.raises(RuntimeError, match="layout"):
        op(x, weight, bias, 1, False, None)
    with pytest.raises(RuntimeError, match="residual"):
        op(x, packed, bias, 1, False, torch.zeros(2, 3, 32, dtype=torch.bfloat16))
    assert op(x[:, :2], packed, bias, 1, False, None).shape == (2, 0, 32)  # no new column


def test_a_module_packs_rows_only_where_it_fits() -> None:
    dense = CausalConv1d(32, 32, 3).bfloat16()
    assert dense.pack_rows_() and dense.row_packed is not None
    assert dense.conv.weight.numel() == 0  # the plain weight is released
    for unfit in (
        CausalConv1d(32, 32, 7, groups=32).bfloat16(),  # depthwise
        CausalConv1d(16, 1, 7).bfloat16(),  # one output
        CausalConv1d(32, 32, 3),  # fp32
    ):
        assert not unfit.pack_rows_() and unfit.row_packed is None


@torch.inference_mode()
def test_a_packed_module_convolves_at_once_without_a_context() -> None:
    """A row-packed module called without a left context (the whole input at once) pads it
    as the plain module does and runs the kernel on those rows: the op's bits, within a step
    of the exact convolution; its bias (held in fp32 once packed) is the plain one's."""
    module = CausalConv1d(64, 64, 5, dilation=2).bfloat16()
    weight, bias = module.conv.weight.detach().clone(), module.conv.bias.detach().clone()
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 64, 23, generator=gen).bfloat16()  # [B, C, T]
    residual = torch.randn(2, 64, 23, generator=gen).bfloat16()
    assert module.pack_rows_() and module.row_bias is not None
    assert torch.equal(module.row_bias, bias.float())
    got = module(x)  # [B, C, T]
    padded = F.pad(x, (module.context_width, 0))  # [B, C, W + T]
    rows = row_conv(padded.transpose(1, 2).contiguous(), weight, bias, 2)  # [B, T, C]
    assert got.shape == x.shape and torch.equal(got, rows.transpose(1, 2))
    exact = F.conv1d(padded.float(), weight.float(), bias.float(), dilation=2)
    assert ((got.float() - exact).abs() <= bf16_step(exact)).all()
    assert torch.equal(module(x, residual=residual), residual + got)
    activated = module(x, silu=True)
    assert ((activated.float() - F.silu(got).float()).abs() <= bf16_step(F.silu(got).float())).all()


@torch.inference_mode()
def test_the_decoder_on_row_convs_decodes_chunks_as_at_once() -> None:
    """The synthetic 1.5 vocoder with its dense convolutions on row_conv: chunks of 1, 3, 8 and
    12 frames give the bits of one call, and oneDNN's decoder differs from it by roundings."""
    decoder, _ = synthetic_codec("1.5", torch.device("cpu"))
    rows = IncrementalDecoder(decoder, "cpu", torch.bfloat16, row_convs=True)
    onednn = IncrementalDecoder(decoder, "cpu", torch.bfloat16)
    assert rows.row_convs >= 90 and onednn.row_convs == 0
    assert rows.conv_kernels.startswith("row_conv") and onednn.conv_kernels == "onednn"
    codes = torch.randint(
        0, 1000, (rows.n_codebooks, 24), generator=torch.Generator().manual_seed(1)
    )
    whole = rows.decode([rows.new_state()], [codes])[0]
    state = rows.new_state()
    chunks = [(0, 1), (1, 4), (4, 12), (12, 24)]
    pieces = torch.cat([rows.decode([state], [codes[:, a:b]])[0] for a, b in chunks])
    assert torch.equal(pieces, whole)
    other = onednn.decode([onednn.new_state()], [codes])[0]
    assert 0 < (other - whole).abs().max() < 0.05
