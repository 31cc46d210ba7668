"""The product team (``csrc/product_team.h``): row_linear's bits whatever thread makes a task,
where it applies, and a failing product that stops the team instead of hanging it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from streamtts.models.fish.fused.layers import LayerWeights, packed
from streamtts.models.fish.fused.pairs import pack_pairs, why_not_paired
from tests.models.fish.fused.models import paired, tiny

pytestmark = pytest.mark.usefixtures("fused_library")

# (outputs, inputs) of a chain of products: one task, a part task, 20 tasks (Fish-Speech 1.5's
# fast wqkv), more tasks than a helper prefetches, and a long input (w2).
SHAPES = [(64, 64), (100, 160), (1280, 1024), (8192, 512), (1024, 4096)]


@pytest.fixture(scope="module", autouse=True)
def paired_here() -> None:
    if (reason := why_not_paired()) is not None:
        pytest.skip(f"the pairs layout does not apply here: {reason}")


@pytest.fixture
def threads() -> Iterator[None]:
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def chain(rows: int, seed: int) -> tuple[list[torch.Tensor], ...]:
    """Inputs, paired weights, biases (every other) and residuals (every third) of SHAPES."""
    gen = torch.Generator().manual_seed(seed)
    xs, weights, biases, residuals = [], [], [], []
    for i, (n, k) in enumerate(SHAPES):
        xs.append(torch.randn(rows, k, generator=gen).bfloat16())
        weights.append(pack_pairs(torch.randn(n, k, generator=gen).div(k**0.5).bfloat16()))
        n_padded = weights[-1].shape[0] * weights[-1].shape[2]
        bias = torch.randn(n_padded, generator=gen).bfloat16()
        biases.append(bias if i % 2 == 0 else None)
        residual = torch.randn(rows, n_padded, generator=gen).bfloat16()
        residuals.append(residual if i % 3 == 1 else None)
    return xs, weights, biases, residuals


@pytest.mark.parametrize("team_threads", [2, 3])
@pytest.mark.usefixtures("threads")
def test_a_team_makes_row_linear_s_bits(team_threads: int) -> None:
    """Each product of the chain equals row_linear's (row_linear_add's with a residual), for
    1 to 4 rows, with one helper and with two (more threads than this host's cores)."""
    torch.set_num_threads(team_threads)
    ops = torch.ops.streamtts_fused
    for rows in (1, 2, 3, 4):
        xs, weights, biases, residuals = chain(rows, seed=rows)
        assert ops.product_team_applies(weights, rows)
        for _ in range(3):  # the helpers race the caller differently each time
            got = ops.team_products(xs, weights, biases, residuals)
            for x, w, b, r, y in zip(xs, weights, biases, residuals, got, strict=True):
                want = ops.row_linear(x, w, b) if r is None else ops.row_linear_add(x, w, b, r)
                assert torch.equal(y, want), (rows, tuple(w.shape))


@pytest.mark.usefixtures("threads")
def test_a_team_applies_to_a_decode_step_s_rows_on_several_threads() -> None:
    ops = torch.ops.streamtts_fused
    _, weights, _, _ = chain(1, seed=0)
    torch.set_num_threads(2)
    assert ops.product_team_applies(weights, 1) and ops.product_team_applies(weights, 4)
    assert not ops.product_team_applies(weights, 5)  # a prompt's rows: row_linear's own split
    assert not ops.product_team_applies([*weights, weights[0].float()], 1)
    torch.set_num_threads(1)
    assert not ops.product_team_applies(weights, 1)


@pytest.mark.usefixtures("threads")
def test_a_failing_product_stops_the_team_and_raises() -> None:
    """A product whose rows do not fit its weight raises from the call, after the products
    before it; the helpers leave, and the next team works."""
    torch.set_num_threads(2)
    ops = torch.ops.streamtts_fused
    xs, weights, biases, residuals = chain(2, seed=7)
    wrong = [xs[0], xs[0], *xs[2:]]  # the second weight takes 160 inputs, not 64
    with pytest.raises(RuntimeError, match="rows of 64 for a weight of 160 inputs"):
        ops.team_products(wrong, weights, biases, residuals)
    got = ops.team_products(xs, weights, biases, residuals)
    assert torch.equal(got[0], ops.row_linear(xs[0], weights[0], biases[0]))


@pytest.mark.usefixtures("threads")
def test_the_fused_ops_of_a_paired_model_make_their_products_in_a_team() -> None:
    """Where the bit-for-bit tests of the codebook pass and the slow step run paired models
    on two threads, their products are the team's."""
    torch.set_num_threads(2)
    model = paired(tiny(torch.bfloat16))
    fast = LayerWeights.of(model.fast_layers).packed + [packed(model.fast_output).packed]
    slow = LayerWeights.of(model.layers).packed + [packed(model.output).packed]
    for rows in (1, 3):
        assert torch.ops.streamtts_fused.product_team_applies(fast, rows)
        assert torch.ops.streamtts_fused.product_team_applies(slow, rows)
