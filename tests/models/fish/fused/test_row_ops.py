"""The fused ops' RMSNorm and rotation (``csrc/packed_ops.h``): the Python kernels' bits on any
input, in the scalar loops and the 16-value vector ones alike."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from streamtts.models.fish.llm.llama import rotate_pairs

pytestmark = pytest.mark.usefixtures("fused_library")

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPS = 1e-6
# 1 and 5 rows stay on the calling thread, 40 are split between threads (kRowsPerThread).
ROWS = (1, 5, 40)
# Values rounding treats apart: in the first row the small ones (denormals in bf16 and fp32,
# zeros of both signs), in the last row the NaN, in the one before (or a single row) the
# infinities.
SMALL = (1e-39, -3e-40, 0.0, -0.0)
LARGE = (float("inf"), float("-inf"))


def values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values over several scales, with the special values above placed."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor([1e-3, 1.0, 30.0])[torch.randint(0, 3, shape, generator=gen)]
    x = torch.randn(shape, generator=gen) * scale
    rows = x.view(-1, shape[-1])
    for i, small in enumerate(SMALL):
        rows[0, 5 * i + 1] = small
    for i, large in enumerate(LARGE):
        rows[max(-2, -len(rows)), 5 * i + 2] = large
    rows[-1, 3] = float("nan")
    return x.to(dtype)


def assert_same_values(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal values and NaN at the same places (ATen's vector code writes NaN's pattern
    otherwise than c10's scalar rounding)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [64, 1000, 1024, 4097])
def test_rms_norm_gives_the_python_bits(dtype: torch.dtype, dim: int) -> None:
    gen = torch.Generator().manual_seed(dim)
    weight = (torch.rand(dim, generator=gen) * 2).to(dtype)
    for rows in ROWS:
        x = values((rows, dim), dtype, seed=rows)
        want = F.rms_norm(x, (dim,), eps=EPS) * weight
        got = torch.ops.streamtts_fused.rms_norm(x, weight, EPS)
        assert_same_values(got, want)
        if rows > 2:  # the rows before the infinities and the NaN, bit for bit
            assert torch.equal(got[:-2], want[:-2]), (dtype, dim, rows)


def test_rms_norm_keeps_leading_dims() -> None:
    x = values((2, 3, 128), torch.bfloat16, seed=0)
    weight = torch.ones(128, dtype=torch.bfloat16)
    got = torch.ops.streamtts_fused.rms_norm(x, weight, EPS)
    assert_same_values(got, F.rms_norm(x, (128,), eps=EPS) * weight)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dh", [6, 24, 64])
def test_rotation_gives_the_python_bits(dtype: torch.dtype, dh: int) -> None:
    """Rows wider than the rotated heads (the values after them), a row of its own rotation
    each or one rotation for all."""
    heads, width = 3, 3 * dh + 2 * dh
    for rows in ROWS:
        x = values((rows, width), dtype, seed=dh + rows)
        angles = torch.rand(rows, dh // 2, generator=torch.Generator().manual_seed(rows)) * 6
        cos = angles.cos().repeat_interleave(2, dim=-1)  # [B, Dh] as rope_table lays them
        sin = torch.stack([-angles.sin(), angles.sin()], dim=-1).flatten(-2)
        x32 = x[:, : heads * dh].float().view(rows, heads, dh)
        for c, s in ((cos, sin), (cos[0], sin[0])):
            trig = (c[:, None], s[:, None]) if c.dim() == 2 else (c, s)
            want = rotate_pairs(x32, *trig).to(dtype)
            got = torch.ops.streamtts_fused.rotate_pairs_rounded(x, heads, dh, c, s)
            assert_same_values(got, want)
