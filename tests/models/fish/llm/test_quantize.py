"""Int8 weight-only linear layers: exact arithmetic on the dequantized weights, bounded error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from streamtts.models.fish.llm.checkpoint import load_fish_llm
from streamtts.models.fish.llm.quantize import (
    INT8_MAX,
    PROMPT_GEMM_MIN_TOKENS,
    ROW_KERNEL_DTYPE,
    Int8Linear,
    quantize_int8_,
)
from tests.fish_fixture import Index, expected


def test_int8_linear_applies_its_dequantized_weight() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=False).to(torch.bfloat16)
    q = Int8Linear.from_linear(linear)
    assert q.weight_q.dtype == torch.int8 and q.weight_q.shape == (40, 96)
    # Round to nearest: every weight within half a step of its channel's scale (a hair more
    # where the bf16-rounded scale makes the row's largest weight clamp at 127).
    error = (linear.weight.float() - q.dequantized()).abs()
    assert bool((error <= q.scales.float()[:, None] * 0.51).all())
    assert int(q.weight_q.abs().max()) == INT8_MAX  # the largest weight of a row uses the range
    x = torch.randn(3, 5, 96, dtype=torch.bfloat16)
    want = (x.float() @ q.dequantized().T).to(torch.bfloat16)
    got = q(x)
    assert got.shape == (3, 5, 40)
    torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.02)


def test_prompt_chunks_take_the_matrix_path_within_a_rounding_of_the_row_kernel() -> None:
    torch.manual_seed(1)
    q = Int8Linear.from_linear(nn.Linear(256, 512, bias=False).to(torch.bfloat16))
    tokens = PROMPT_GEMM_MIN_TOKENS[torch.bfloat16] + 24
    x = torch.randn(1, tokens, 256, dtype=torch.bfloat16)  # [B, S, in]: a prompt chunk
    got = q(x).float()
    # What the row kernel computes for the same rows (one position per row: a decode batch).
    rows = q(x.reshape(tokens, 1, 256)).reshape(1, tokens, 512).float()
    exact = x.float() @ q.dequantized().T
    assert got.shape == rows.shape == (1, tokens, 512)
    assert not torch.equal(got, rows)  # really another kernel
    # Both within bf16 rounding of the exact product; the two differ by a rounding at most.
    step = exact.abs() * 2.0**-7 + 1e-3
    assert bool(((got - exact).abs() <= step).all())
    assert bool(((rows - exact).abs() <= step).all())
    assert bool(((got - rows).abs() <= 2 * step).all())


def test_an_fp32_model_runs_the_row_kernel_in_bf16_and_stays_fp32_around_it() -> None:
    """Where int8 computes in fp32 (a CPU without native bf16), a decode row goes through the
    bf16 row kernel (the vectorized one) and comes back fp32, and so does a prompt chunk shorter
    than fp32's crossover; a longer chunk runs an fp32 matrix product on the exact dequantized
    weight."""
    torch.manual_seed(2)
    q = Int8Linear.from_linear(nn.Linear(96, 40, bias=False))
    assert q.scales.dtype == ROW_KERNEL_DTYPE
    crossover = PROMPT_GEMM_MIN_TOKENS[torch.float32]
    for rows in (torch.randn(3, 1, 96), torch.randn(1, crossover - 1, 96)):  # decode; short
        got = q(rows)
        assert got.dtype == torch.float32 and got.shape == (*rows.shape[:-1], 40)
        one_per_row = rows.reshape(-1, 1, 96).to(ROW_KERNEL_DTYPE)  # the row kernel's shape
        assert torch.equal(got, q(one_per_row).reshape(got.shape).float())
    prompt = torch.randn(1, crossover, 96)
    got = q(prompt)
    assert got.dtype == torch.float32
    assert not torch.equal(got, q(prompt.reshape(-1, 1, 96)).reshape(got.shape))
    torch.testing.assert_close(got, prompt @ q.dequantized().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prompt_conversions_share_a_buffer_per_thread_without_mixing_layers(
    dtype: torch.dtype,
) -> None:
    """Layers of different sizes take turns in one thread's conversion buffer, and threads
    prefilling at once each use their own: every product matches its layer's alone."""
    torch.manual_seed(3)
    layers = [
        Int8Linear.from_linear(nn.Linear(64, out, bias=False).to(dtype)) for out in (48, 160, 96)
    ]
    prompt = torch.randn(1, PROMPT_GEMM_MIN_TOKENS[dtype], 64, dtype=dtype)
    exact = [(prompt.float() @ layer.dequantized().T) for layer in layers]
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    mismatches: list[int] = []

    def run_layers(rounds: int) -> None:
        for _ in range(rounds):
            for index, layer in enumerate(layers):
                got = layer(prompt).float()
                if not torch.allclose(got, exact[index], rtol=tolerance, atol=tolerance):
                    mismatches.append(index)

    threads = [threading.Thread(target=run_layers, args=(50,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    run_layers(50)
    for thread in threads:
        thread.join()
    assert mismatches == []


def test_int8_layers_refuse_a_dtype_they_do_not_compute_in() -> None:
    with pytest.raises(ValueError, match="bf16 or fp32"):
        quantize_int8_(nn.Sequential(nn.Linear(8, 8, bias=False).half()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantized_fixture_model_stays_close_to_its_dtype(
    fish_fixture_dir: Path, fish_index: Index, dtype: torch.dtype
) -> None:
    llm = load_fish_llm(fish_fixture_dir, dtype)
    tokens = torch.from_numpy(expected(fish_fixture_dir, fish_index, "llm_input.npy"))
    with torch.inference_mode():
        want = llm.model.forward_slow_train(tokens).logits.float()
        linears = sum(isinstance(m, nn.Linear) for m in llm.model.modules())
        assert quantize_int8_(llm.model) == linears > 0
        assert not any(isinstance(m, nn.Linear) for m in llm.model.modules())
        got = llm.model.forward_slow_train(tokens).logits.float()
    relative = float((got - want).norm() / want.norm())
    assert relative < 0.05, relative
    # The greedy choice at most positions is unchanged.
    agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    assert agree > 0.9, agree
