"""row_linear on the pairs layout: fp32 sums rounded once to bf16; which layers pair."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from streamtts.fish.load import prepare_llm
from streamtts.fish.settings import FishSettings
from streamtts.models.fish.fused.arena import HUGE_PAGE_BYTES
from streamtts.models.fish.fused.pairs import (
    OUTPUTS_PER_TASK,
    PairedLinear,
    pack_pairs,
    pair_linears_,
    pairs_fit,
    pairs_shape,
    products,
    why_not_paired,
)
from streamtts.models.fish.llm.synthetic import load_synthetic
from streamtts.models.fish.packed import PackedLinear, packs
from tests.models.fish.bf16 import bf16_step

# The fast layers' shapes of the tiny models and of Fish-Speech 1.5 (wqkv, w13, w2, head).
SHAPES = [(128, 64), (320, 64), (64, 160), (1280, 1024), (8192, 1024), (1024, 4096)]
ROWS = [1, 2, 3, 4, 5, 8, 9, 17]


@pytest.fixture(scope="module")
def paired_here() -> None:
    if not packs(torch.device("cpu"), torch.bfloat16):
        pytest.skip("oneDNN has no bf16 kernels here")
    if (reason := why_not_paired()) is not None:
        pytest.skip(f"the pairs layout does not apply here: {reason}")


def test_the_layout_holds_each_task_s_pairs_contiguously() -> None:
    weight = torch.arange(128 * 6, dtype=torch.float32).reshape(128, 6).bfloat16()
    packed = pack_pairs(weight)
    assert packed.shape == (2, 3, OUTPUTS_PER_TASK, 2) and packed.is_contiguous()
    for task, pair, output, half in ((0, 0, 0, 0), (1, 2, 63, 1), (1, 0, 5, 1), (0, 1, 7, 0)):
        want = weight[OUTPUTS_PER_TASK * task + output, 2 * pair + half]
        assert packed[task, pair, output, half] == want


def test_a_layout_of_part_tasks_pads_the_last_with_zero_weights() -> None:
    weight = torch.arange(100 * 4, dtype=torch.float32).reshape(100, 4).add(1).bfloat16()
    packed = pack_pairs(weight)
    assert packed.shape == (2, 2, OUTPUTS_PER_TASK, 2) and packed.is_contiguous()
    assert packed[1, 1, 35, 0] == weight[99, 2]
    assert bool((packed[1, :, 36:] == 0).all()) and bool((packed[1, :, :36] != 0).all())


def test_a_layout_packs_into_a_given_tensor_and_refuses_a_wrong_one() -> None:
    weight = torch.arange(100 * 4, dtype=torch.float32).reshape(100, 4).bfloat16()
    into = torch.full(pairs_shape(weight), 7, dtype=torch.bfloat16)
    assert pack_pairs(weight, into) is into
    assert torch.equal(into, pack_pairs(weight))  # padding zeroed, not left as it was
    with pytest.raises(ValueError, match="out must be contiguous"):
        pack_pairs(weight, torch.empty(2, 2, OUTPUTS_PER_TASK, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out must be contiguous"):
        pack_pairs(weight, into.float())


def test_bf16_weights_of_even_inputs_fit_and_only_heads_need_not_be_whole_tasks() -> None:
    assert pairs_fit(torch.zeros(1280, 1024, dtype=torch.bfloat16))
    assert not pairs_fit(torch.zeros(1280, 1024))  # fp32
    assert not pairs_fit(torch.zeros(1000, 1024, dtype=torch.bfloat16))
    assert pairs_fit(torch.zeros(1000, 1024, dtype=torch.bfloat16), head=True)
    assert not pairs_fit(torch.zeros(1024, 1023, dtype=torch.bfloat16), head=True)


@pytest.mark.usefixtures("paired_here")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_row_linear_rounds_fp32_sums_once(shape: tuple[int, int]) -> None:
    """Every output within a bf16 step of the fp32 sum (the sums run in another order than
    the reference's), nearly all of them that sum rounded, for any row count and a bias."""
    n, k = shape
    gen = torch.Generator().manual_seed(n + k)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    for layer_bias in (None, bias):
        layer = PairedLinear(weight, layer_bias)
        for rows in ROWS:
            x = torch.randn(rows, k, generator=gen).bfloat16()
            want = x.float() @ weight.float().T
            if layer_bias is not None:
                want += layer_bias.float()
            got = layer(x)
            assert got.shape == (rows, n) and got.dtype == torch.bfloat16
            # A step of the output, or where a sum cancels to near zero, fp32's roundings of
            # the terms (2^-16 of the largest output).
            allowed = bf16_step(want).clamp(min=float(want.abs().max()) * 2.0**-16)
            assert bool(((got.float() - want).abs() <= allowed).all()), (rows, shape)
            rounded = (got == want.bfloat16()).float().mean().item()
            assert rounded > 0.99, (rows, shape, rounded)


@pytest.mark.usefixtures("paired_here")
def test_row_linear_rounds_as_torch_does_denormals_infinities_and_nan() -> None:
    """The fp32 sum is rounded as c10 rounds a float to bf16 (``.bfloat16()``): a zero product
    plus a bias gives the bias, its denormals kept, ±0, ±inf and NaN too. (VCVTNEPS2BF16, and
    oneDNN's bf16 ``F.linear``, flush denormals to zero.)"""
    tiny = torch.finfo(torch.bfloat16).tiny  # the smallest normal bf16
    specials = [tiny / 2, -tiny / 4, tiny / 128, -tiny * 3 / 8, 0.0, -0.0, math.inf, -math.inf]
    bias = torch.tensor(specials * 8, dtype=torch.float32).bfloat16()  # [64]
    bias[5] = math.nan
    magnitude = bias.float().abs()
    assert int(((magnitude > 0) & (magnitude < tiny)).sum()) == 4 * 8  # denormals as bf16 too
    weight, x = torch.randn(64, 32).bfloat16(), torch.zeros(3, 32).bfloat16()
    got = PairedLinear(weight, bias)(x)
    want = F.linear(x.float(), weight.float(), bias.float()).bfloat16()
    assert torch.equal(got.isnan(), want.isnan()) and bool(got.isnan()[:, 5].all())
    same = got.view(torch.int16) == want.view(torch.int16)  # the bit patterns: -0.0 too
    assert bool(same[:, torch.arange(64) != 5].all())


@pytest.mark.usefixtures("paired_here")
def test_row_linear_keeps_leading_dims_and_agrees_with_onednn() -> None:
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(1280, 1024, generator=gen).bfloat16()
    x = torch.randn(2, 3, 1024, generator=gen).bfloat16()
    got = PairedLinear(weight)(x)
    want = PackedLinear(weight)(x)
    assert got.shape == want.shape == (2, 3, 1280)
    apart = got != want
    assert int(apart.sum()) <= want.numel() // 100  # a step apart here and there, no more
    assert bool(((got - want).float().abs()[apart] <= bf16_step(want.float())[apart]).all())


@pytest.mark.usefixtures("paired_here")
def test_row_linear_gives_the_same_bits_on_any_number_of_threads() -> None:
    gen = torch.Generator().manual_seed(4)
    layer = PairedLinear(torch.randn(1024, 4096, generator=gen).bfloat16())
    x = torch.randn(3, 4096, generator=gen).bfloat16()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = layer(x)
        torch.set_num_threads(max(2, threads))
        many = layer(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


@pytest.mark.usefixtures("paired_here")
@pytest.mark.parametrize("shape", SHAPES[:3] + SHAPES[4:5], ids=str)
def test_row_linear_add_is_the_residual_plus_the_product_bit_for_bit(
    shape: tuple[int, int],
) -> None:
    """The residual connection in the product's epilogue: what ``residual + row_linear(x)``
    gives (ATen's bf16 add), for decode tiles and prompt tiles, a bias or none, leading dims,
    a strided residual, sums that cancel (a residual of the product's negation), and residuals
    of denormals, zeros, infinities and a NaN added to a zero product."""
    n, k = shape
    gen = torch.Generator().manual_seed(n * k)
    weight = pack_pairs(torch.randn(n, k, generator=gen).bfloat16())
    bias = torch.randn(n, generator=gen).bfloat16()
    for layer_bias in (None, bias):
        for rows in ROWS:
            x = torch.randn(rows, k, generator=gen).bfloat16()
            product = torch.ops.streamtts_fused.row_linear(x, weight, layer_bias)
            for scale in (0.01, 1.0, 300.0):
                residual = (torch.randn(rows, n, generator=gen) * scale).bfloat16()
                got = torch.ops.streamtts_fused.row_linear_add(x, weight, layer_bias, residual)
                assert torch.equal(got, residual + product), (rows, scale)
            cancelling = -product
            got = torch.ops.streamtts_fused.row_linear_add(x, weight, layer_bias, cancelling)
            assert torch.equal(got, cancelling + product)
    x = torch.randn(2, 3, k, generator=gen).bfloat16()
    wide = torch.randn(2, 3, 2 * n, generator=gen).bfloat16()
    residual = wide[..., ::2]  # [2, 3, N], strided
    got = torch.ops.streamtts_fused.row_linear_add(x, weight, None, residual)
    assert got.shape == (2, 3, n)
    assert torch.equal(got, residual + torch.ops.streamtts_fused.row_linear(x, weight, None))
    zeros = torch.zeros(1, k, dtype=torch.bfloat16)
    specials = torch.tensor([1e-39, -3e-40, 0.0, -0.0, float("inf"), float("-inf"), float("nan")])
    special = specials.repeat(n // len(specials) + 1)[:n][None].bfloat16()  # [1, N]
    got = torch.ops.streamtts_fused.row_linear_add(zeros, weight, None, special)
    want = special + torch.ops.streamtts_fused.row_linear(zeros, weight, None)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.usefixtures("paired_here")
def test_row_linear_says_what_is_wrong() -> None:
    weight = pack_pairs(torch.randn(128, 64).bfloat16())
    with pytest.raises(RuntimeError, match="rows of 32 for a weight of 64 inputs"):
        torch.ops.streamtts_fused.row_linear(torch.randn(1, 32).bfloat16(), weight, None)
    with pytest.raises(RuntimeError, match="expected bf16 rows"):
        torch.ops.streamtts_fused.row_linear(torch.randn(1, 64), weight, None)
    with pytest.raises(RuntimeError, match="not in the pairs layout"):
        plain = torch.randn(128, 64).bfloat16()
        torch.ops.streamtts_fused.row_linear(torch.randn(1, 64).bfloat16(), plain, None)
    with pytest.raises(RuntimeError, match="a bias of 3 for 128 outputs"):
        bias = torch.zeros(3).bfloat16()
        torch.ops.streamtts_fused.row_linear(torch.randn(1, 64).bfloat16(), weight, bias)
    with pytest.raises(RuntimeError, match="residual must be bf16 of the output's shape"):
        residual = torch.zeros(1, 64).bfloat16()
        torch.ops.streamtts_fused.row_linear_add(
            torch.randn(1, 64).bfloat16(), weight, None, residual
        )
    with pytest.raises(RuntimeError, match="residual must be bf16"):
        residual = torch.zeros(1, 128)
        torch.ops.streamtts_fused.row_linear_add(
            torch.randn(1, 64).bfloat16(), weight, None, residual
        )


@pytest.mark.usefixtures("paired_here")
@torch.inference_mode()
def test_a_compiled_paired_layer_computes_what_eager_does() -> None:
    """torch.compile traces the op through its registered shape, then calls the kernel."""
    layer = PairedLinear(torch.randn(320, 64).bfloat16(), torch.randn(320).bfloat16())
    x = torch.randn(3, 64).bfloat16()
    compiled = torch.compile(lambda rows: F.silu(layer(rows)), fullgraph=True)
    assert torch.equal(compiled(x), F.silu(layer(x)))


@pytest.mark.usefixtures("paired_here")
@pytest.mark.parametrize("amx", [False, True], ids=["no AMX", "AMX"])
def test_prepare_llm_pairs_the_fast_layers_and_without_amx_the_slow_ones(
    amx: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    model = load_synthetic("tiny", torch.bfloat16, "cpu", seed=2).model
    prepare_llm(model, FishSettings())
    assert products(model.fast_layers) == products(model.fast_output) == "row_linear"
    assert products(model.layers) == ("onednn" if amx else "row_linear")
    assert isinstance(model.output, PairedLinear) != amx  # the tiny head's 1664 rows fit
    off = load_synthetic("tiny", torch.bfloat16, "cpu", seed=2).model
    prepare_llm(off, FishSettings(fused_ops=False))
    assert products(off.fast_layers) == products(off.layers) == "onednn"
    plain = load_synthetic("tiny", torch.float32, "cpu", seed=2).model
    prepare_llm(plain, FishSettings(dtype="fp32"))
    assert products(plain.fast_layers) == "aten"


@pytest.mark.usefixtures("paired_here")
def test_paired_weights_lie_end_to_end_on_huge_pages_in_the_model_s_order() -> None:
    model = load_synthetic("tiny", torch.bfloat16, "cpu", seed=2).model
    linears = [
        (parent, name, child.weight.detach().clone())
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, torch.nn.Linear)
    ]
    count = pair_linears_(model, slow=True)
    paired = [m for m in model.modules() if isinstance(m, PairedLinear)]
    assert count == len(paired) > 2
    assert paired[0].packed.data_ptr() % HUGE_PAGE_BYTES == 0
    for before, after in zip(paired, paired[1:], strict=False):
        end = before.packed.data_ptr() + before.packed.numel() * before.packed.element_size()
        assert after.packed.data_ptr() == end
    checked = 0
    for parent, name, weight in linears:
        if isinstance(layer := getattr(parent, name), PairedLinear):
            assert torch.equal(layer.packed, pack_pairs(weight))
            checked += 1
    assert checked == count


@pytest.mark.usefixtures("paired_here")
def test_a_head_of_part_tasks_pairs_and_drops_its_padding() -> None:
    """Fish-Speech 1.5's text head has 102 048 rows; checked on a small stand-in: its outputs
    are those of the same weight padded by hand, contiguous, the bias padded alike."""
    model = load_synthetic("tiny", torch.bfloat16, "cpu", seed=2).model
    model.output = torch.nn.Linear(64, 1000, bias=False).bfloat16()
    model.layers[0].attention.wo = torch.nn.Linear(64, 100, bias=False).bfloat16()
    pair_linears_(model, slow=True)
    assert isinstance(model.output, PairedLinear) and isinstance(model.fast_output, PairedLinear)
    assert isinstance(model.layers[0].attention.wo, torch.nn.Linear)  # not a head: not padded
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(1000, 64, generator=gen).bfloat16()
    bias = torch.randn(1000, generator=gen).bfloat16()
    layer = PairedLinear(weight, bias)
    assert layer.out_features == 1000 and layer.bias is not None and layer.bias.shape == (1024,)
    padded = torch.cat([weight, weight.new_zeros(24, 64)])
    by_hand = PairedLinear(padded, torch.cat([bias, bias.new_zeros(24)]))
    x = torch.randn(2, 3, 64, generator=gen).bfloat16()
    got = layer(x)
    assert got.shape == (2, 3, 1000) and got.is_contiguous()
    assert torch.equal(got, by_hand(x)[..., :1000])
    exact = F.linear(x.float(), weight.float(), bias.float())
    assert bool(((got.float() - exact).abs() <= bf16_step(exact)).all())
