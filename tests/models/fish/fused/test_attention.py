"""The codebook pass's attention at one position as one op: the ATen calls' roundings."""

from __future__ import annotations

import math
from unittest.mock import patch

import pytest
import torch

from streamtts.fish.load import prepare_llm
from streamtts.fish.settings import FishSettings
from streamtts.models.fish.fused.pairs import why_not_paired
from streamtts.models.fish.llm.llama import Attention
from streamtts.models.fish.llm.synthetic import load_synthetic
from tests.models.fish.bf16 import bf16_step

pytestmark = pytest.mark.usefixtures("fused_library")

CACHE_POSITIONS = 9  # the fast cache: codebook positions 0..8


def aten_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: int
) -> torch.Tensor:
    """Attention.decode_position's ATen calls: q [B, H, Dh], keys/values [B, G, C, Dh] fp32."""
    b, h, dh = q.shape
    g = keys.shape[1]
    wide = keys.dtype
    grouped = q.to(wide).reshape(b * g, h // g, dh)
    seen_k = keys.narrow(2, 0, pos + 1).flatten(0, 1)
    seen_v = values.narrow(2, 0, pos + 1).flatten(0, 1)
    scores = torch.bmm(grouped, seen_k.transpose(1, 2)).type_as(q)
    probs = torch.softmax(scores.mul_(1.0 / math.sqrt(dh)), dim=-1).to(wide)
    return torch.bmm(probs, seen_v).type_as(q).view(b, h * dh)


def op_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: int
) -> torch.Tensor:
    y: torch.Tensor = torch.ops.streamtts_fused.position_attention(
        q, keys, values, pos, 1.0 / math.sqrt(q.shape[-1])
    )
    return y


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("heads", [(16, 2, 64), (4, 2, 16), (8, 8, 32)], ids=str)
def test_the_op_is_within_the_roundings_of_the_aten_calls(
    dtype: torch.dtype, heads: tuple[int, int, int]
) -> None:
    """Every position, 1 and 3 rows, keys as the cache holds them (a slice of its slots):
    each output within the roundings' reach of the ATen calls' (their sums and exp run in
    another order), nearly all equal."""
    h, g, dh = heads
    gen = torch.Generator().manual_seed(h * g * dh)
    equal = total = 0
    for b in (1, 3):
        cache_k = torch.randn(b + 2, g, CACHE_POSITIONS, dh, generator=gen) * 2
        cache_v = torch.randn(b + 2, g, CACHE_POSITIONS, dh, generator=gen)
        keys, values = cache_k.narrow(0, 0, b), cache_v.narrow(0, 0, b)
        for pos in range(CACHE_POSITIONS):
            rows = (torch.randn(b, h + g, dh, generator=gen) * 2).to(dtype)
            q = rows[:, :h]  # as the pass passes it: the query heads of the rotated rows
            want = aten_attention(q, keys, values, pos)
            got = op_attention(q, keys, values, pos)
            assert got.shape == want.shape and got.dtype == dtype
            apart = (got.float() - want.float()).abs()
            # Two steps of the output, and a probability's rounding times the largest value.
            eps = torch.finfo(dtype).eps
            step = bf16_step(want.float()) if dtype == torch.bfloat16 else want.abs() * eps
            allowed = 2 * step + eps * float(values.abs().max())
            assert bool((apart <= allowed).all()), (b, pos)
            equal += int((got == want).sum())
            total += want.numel()
    assert equal / total > 0.97, equal / total


def test_at_the_first_position_it_is_the_values_rounded() -> None:
    """One key: the softmax is 1, the output that key's values rounded (exact either way)."""
    q = torch.randn(2, 16, 64).bfloat16()
    keys, values = torch.randn(2, 2, CACHE_POSITIONS, 64), torch.randn(2, 2, CACHE_POSITIONS, 64)
    want = values[:, :, 0].repeat_interleave(8, dim=1).bfloat16().reshape(2, 16 * 64)
    assert torch.equal(op_attention(q, keys, values, 0), want)


def test_paired_fast_layers_attend_with_the_op() -> None:
    if (reason := why_not_paired()) is not None:
        pytest.skip(f"the pairs layout does not apply here: {reason}")
    model = load_synthetic("tiny", torch.bfloat16, "cpu", seed=3).model
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    assert not any(a.own_kernel for a in attentions)
    prepare_llm(model, FishSettings(dtype="bf16"))
    fast = {id(m) for m in model.fast_layers.modules()}
    assert all(a.own_kernel == (id(a) in fast) for a in attentions)
    real = torch.ops.streamtts_fused.position_attention
    with (
        patch.object(torch.ops.streamtts_fused, "position_attention", wraps=real) as op,
        torch.inference_mode(),
    ):
        cache = model.allocate_cache(1, 16)
        model.fast_step(cache, torch.randn(1, model.config.dim).bfloat16(), 0, logits=False)
    assert op.call_count == len(model.fast_layers)


def test_the_op_says_what_is_wrong() -> None:
    q = torch.randn(1, 16, 64).bfloat16()
    keys = torch.randn(1, 2, CACHE_POSITIONS, 64)
    with pytest.raises(RuntimeError, match="bf16 or fp16"):
        op_attention(q.float(), keys, keys, 0)
    with pytest.raises(RuntimeError, match="fp32"):
        op_attention(q, keys.bfloat16(), keys.bfloat16(), 0)
    with pytest.raises(RuntimeError, match="outside the cache"):
        op_attention(q, keys, keys, CACHE_POSITIONS)
    with pytest.raises(RuntimeError, match="do not fit"):
        op_attention(torch.randn(1, 16, 32).bfloat16(), keys, keys, 0)
