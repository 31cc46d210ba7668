"""The fast (codebook) transformer's one-position kernels against upstream's formulation."""

from __future__ import annotations

import pytest
import torch

from streamtts.models.fish.llm.config import BlockConfig
from streamtts.models.fish.llm.llama import (
    Attention,
    FastPosition,
    RMSNorm,
    apply_rope,
    attention_bias,
    explicit_attention,
    rope_table,
    rotate_pairs,
)

BLOCK = BlockConfig(
    n_layer=1, dim=256, n_head=16, n_local_heads=2, head_dim=16, intermediate_size=512,
    attention_qkv_bias=False, norm_eps=1e-6, rope_base=1e6,
)  # fmt: skip
POSITIONS = 8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1024), (4, 1024), (3, 7, 64)])
def test_rms_norm_is_upstreams_formula_bit_for_bit(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    gen = torch.Generator().manual_seed(len(shape))
    norm = RMSNorm(shape[-1], 1e-6).to(dtype)
    norm.weight.data = torch.randn(shape[-1], generator=gen).to(dtype)
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    x32 = x.float()
    upstream = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x)
    assert torch.equal(norm(x), upstream * norm.weight)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotate_pairs_rounds_like_apply_rope(dtype: torch.dtype) -> None:
    table = rope_table(POSITIONS, 64, 1e6, torch.device("cpu"))  # [P, 2, Dh]
    x = torch.randn(3, 1, 18, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    for pos in range(POSITIONS):
        expected = apply_rope(x, table[pos : pos + 1][None])  # [3,1,18,64]
        got = rotate_pairs(x.float(), table[pos, 0], table[pos, 1]).type_as(x)
        assert torch.equal(got, expected)


def upstream_position(
    attention: Attention,
    x: torch.Tensor,
    table: torch.Tensor,
    pos: int,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
) -> torch.Tensor:
    """Upstream's fast attention at ``pos``: x [B, D], written into a masked cache [B,G,C,Dh]."""
    bias = attention_bias((torch.arange(cache_k.shape[2]) <= pos)[None, :], x.dtype)  # [1, C]

    def attend(_: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache_k[:, :, pos] = k[:, :, 0]
        cache_v[:, :, pos] = v[:, :, 0]
        return explicit_attention(q, cache_k, cache_v, bias)

    out: torch.Tensor = attention(x[:, None], table[pos : pos + 1][None], attend, 0)
    return out[:, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@torch.inference_mode()
def test_one_position_attention_equals_masked_explicit_attention(dtype: torch.dtype) -> None:
    """decode_position over the positions written so far = explicit_attention over the whole
    masked cache (what upstream computes), position by position, for a batch of 3."""
    torch.manual_seed(3)
    attention = Attention(BLOCK).to(dtype)
    b, g, dh = 3, BLOCK.n_local_heads, BLOCK.head_dim
    table = rope_table(POSITIONS, dh, BLOCK.rope_base, torch.device("cpu"))
    wide = torch.float32  # the CPU's fast_attention_dtype
    keys = torch.zeros(b, g, POSITIONS, dh, dtype=wide)
    values = torch.zeros(b, g, POSITIONS, dh, dtype=wide)
    reference_k = torch.zeros(b, g, POSITIONS, dh, dtype=dtype)
    reference_v = torch.zeros(b, g, POSITIONS, dh, dtype=dtype)
    for pos in range(POSITIONS):
        x = torch.randn(b, BLOCK.dim).to(dtype)
        at = FastPosition(keys, values, pos, table[pos, 0], table[pos, 1])
        got = attention.decode_position(x, at)
        expected = upstream_position(attention, x, table, pos, reference_k, reference_v)
        assert torch.equal(keys.to(dtype), reference_k) and torch.equal(
            values.to(dtype), reference_v
        )
        if dtype == torch.float32:
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        else:  # the same roundings; sums may accumulate in another order: one bf16 step at most
            step = 2.0**-7 * expected.float().abs().amax().clamp(min=1)
            assert float((got.float() - expected.float()).abs().max()) <= step
