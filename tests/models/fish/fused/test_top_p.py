"""The fused counting top-p: the Python filter's kept tokens and result bits, row by row."""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch

from streamtts.models.fish.llm import sampling

VOCAB = 102_048  # Fish-Speech 1.5's text vocabulary


pytestmark = pytest.mark.usefixtures("fused_library")


def python_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The filter's own ATen calls, with the op loaded."""
    with patch.object(sampling, "_counting_op", lambda: False):
        return sampling.top_p_filter_by_counting(logits, top_p)


def fused_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    filtered: torch.Tensor = torch.ops.streamtts_fused.top_p_by_counting(logits, top_p)
    return filtered


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("scale", [0.05, 0.64, 4.0, 30.0])
def test_the_op_gives_the_python_filters_bits(dtype: torch.dtype, scale: float) -> None:
    """Rows of their own top_p in one batch, ties at the top, infinities, any batch size."""
    gen = torch.Generator().manual_seed(int(scale * 100))
    for batch in (1, 3):
        logits = (torch.randn(batch, VOCAB, generator=gen) * scale).to(dtype)
        logits[0, 100:160] = logits[0].max()  # 61 equal largest values: the cut falls among them
        logits[-1, 7] = float("-inf")
        top_p = torch.tensor([0.7, 0.95, 0.01][:batch])
        want = python_filter(logits, top_p)
        got = fused_filter(logits, top_p)
        assert same_bits(got, want), (batch, int(torch.isfinite(want).sum()))
        assert int(torch.isfinite(got[0]).sum()) < VOCAB  # the cut did remove tokens


def test_edges_match_too() -> None:
    """Everything kept, only the top kept, all tied (lowest ids stay), a NaN row, a row with
    a NaN of the other sign (its pattern sorts last), a row with an infinity."""
    logits = (torch.randn(6, 9000) * 2).bfloat16()
    logits[2] = 0
    logits[3, 5] = float("nan")
    logits[4].view(torch.int16)[6] = -64  # 0xFFC0: a NaN with the sign bit set
    logits[5, 7] = float("inf")
    assert bool(logits[4, 6].isnan())
    for p in (1.0, 1e-6, 0.5):
        top_p = torch.full((6,), p)
        assert same_bits(fused_filter(logits, top_p), python_filter(logits, top_p)), p


def test_the_filter_takes_the_op_where_it_is_loaded() -> None:
    logits = (torch.randn(2, VOCAB) * 3).bfloat16()
    top_p = torch.tensor([0.7, 0.8])
    real = torch.ops.streamtts_fused.top_p_by_counting
    with patch.object(torch.ops.streamtts_fused, "top_p_by_counting", wraps=real) as op:
        sampling.top_p_filter(logits, top_p)
    assert op.call_count == 1


def test_the_op_says_what_is_wrong() -> None:
    with pytest.raises(RuntimeError, match="bf16 or fp16"):
        fused_filter(torch.zeros(1, 9000), torch.tensor([0.7]))
    with pytest.raises(RuntimeError, match=r"\[B, V\]"):
        fused_filter(torch.zeros(9000, dtype=torch.bfloat16), torch.tensor([0.7]))
    with pytest.raises(RuntimeError, match=r"top_p must be \[B\]"):
        fused_filter(torch.zeros(2, 9000, dtype=torch.bfloat16), torch.tensor([0.7]))
