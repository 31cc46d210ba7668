"""The fused draw: the Python draw's ids (with the counting filter), row by row."""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch

from streamtts.models.fish.llm import sampling
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams

SLOW_VOCAB = 102_048  # Fish-Speech 1.5's text vocabulary
CODEBOOK = 1024


pytestmark = pytest.mark.usefixtures("fused_library")


def python_draw(
    logits: torch.Tensor,
    params: BatchSampling,
    window: torch.Tensor | None,
    noise: torch.Tensor,
) -> torch.Tensor:
    """sampling.sample's own ATen calls with the counting filter for every vocabulary."""
    if window is not None:
        logits = sampling.apply_repetition_penalty(logits, window, params.repetition_penalty)
    with patch.object(sampling, "_counting_op", lambda: False):
        logits = sampling.top_p_filter_by_counting(logits, params.top_p)
    logits = sampling.apply_temperature(logits, params.temperature)
    return sampling.exponential_race(torch.softmax(logits, dim=-1), noise)


def fused_draw(
    logits: torch.Tensor,
    params: BatchSampling,
    window: torch.Tensor | None,
    noise: torch.Tensor,
) -> torch.Tensor:
    drawn: torch.Tensor = torch.ops.streamtts_fused.sample_tokens(
        logits, params.temperature, params.top_p, params.repetition_penalty, window, noise
    )
    return drawn


def batch(b: int) -> BatchSampling:
    return BatchSampling.from_params(
        [
            SamplingParams(temperature=(0.7, 1.0, 0.3)[i], top_p=(0.7, 0.95, 0.2)[i])
            for i in range(b)
        ]
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("vocab", [7, CODEBOOK, 9000, SLOW_VOCAB])
def test_the_op_draws_the_python_draws_ids(dtype: torch.dtype, vocab: int) -> None:
    """Rows of their own parameters, windows with repeated ids, ties at the top, infinities,
    peaked and flat rows, the noise a strided view as the codebook pass passes it."""
    gen = torch.Generator().manual_seed(vocab)
    for scale in (0.05, 1.0, 4.0, 30.0):
        for b in (1, 3):
            logits = (torch.randn(b, vocab, generator=gen) * scale).to(dtype)
            if vocab > 100:
                logits[0, 10:40] = logits[0].max()  # 30 equal largest values
                logits[-1, 3] = float("-inf")
            window = torch.randint(0, vocab, (b, 16), generator=gen, dtype=torch.int32)
            window[:, 1] = window[:, 0]  # a repeated id is penalised once
            frame_noise = torch.empty(b, 2, vocab).exponential_(1, generator=gen).to(dtype)
            noise = frame_noise[:, 1]  # [B, V], rows strided
            params = batch(b)
            for w in (None, window):
                want = python_draw(logits, params, w, noise)
                assert torch.equal(fused_draw(logits, params, w, noise), want), (scale, b)


def test_edges_match_too() -> None:
    """Everything kept, only the top kept, all tied, a NaN logit, a zero temperature."""
    logits = (torch.randn(4, CODEBOOK) * 2).bfloat16()
    logits[2] = 0  # all tied: with only the top kept, the lowest id stays
    logits[3, 5] = float("nan")
    noise = torch.empty(4, CODEBOOK).exponential_(1).bfloat16()
    for p in (1.0, 1e-6, 0.5):
        params = BatchSampling(  # a temperature of 0 is clamped to MIN_TEMPERATURE
            temperature=torch.tensor([0.0, 0.5, 1.0, 1.9]),
            top_p=torch.full((4,), p),
            repetition_penalty=torch.ones(4),
        )
        want = python_draw(logits, params, None, noise)
        assert torch.equal(fused_draw(logits, params, None, noise), want), p
        if p == 1e-6:
            assert int(want[2]) == 0


def test_sample_takes_the_op_for_16_bit_codebook_rows() -> None:
    params = batch(2)
    real = torch.ops.streamtts_fused.sample_tokens
    with patch.object(torch.ops.streamtts_fused, "sample_tokens", wraps=real) as op:
        drawn = sampling.sample((torch.randn(2, CODEBOOK) * 3).bfloat16(), params)
        assert op.call_count == 1
        assert drawn.shape == (2,) and drawn.dtype == torch.int64
        sampling.sample(torch.randn(2, CODEBOOK), params)  # fp32: the ATen calls
        sampling.sample(torch.randn(2, SLOW_VOCAB).bfloat16(), params)  # the slow token's too
        assert op.call_count == 1


def test_the_op_says_what_is_wrong() -> None:
    params = batch(1)
    logits = torch.zeros(1, CODEBOOK, dtype=torch.bfloat16)
    noise = torch.ones(1, CODEBOOK, dtype=torch.bfloat16)
    cases = [
        ((torch.zeros(1, CODEBOOK), params, None, noise), "bf16 or fp16"),
        ((logits[0], params, None, noise), r"\[B, V\]"),
        ((logits, batch(2), None, noise), "must be \\[B\\] float32"),
        ((logits, params, None, noise.float()), "noise must be"),
        ((logits, params, torch.tensor([[CODEBOOK]]), noise), r"in \[0, V\)"),
        ((logits, params, torch.tensor([0]), noise), r"window must be \[B, W\]"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            fused_draw(*args)


def test_the_race_rounds_each_quotient_to_the_dtype() -> None:
    """Two tokens whose quotients differ in fp32 but not in bf16: the first id wins, as in
    argmax over the rounded quotients (the larger fp32 quotient is the second's)."""
    logits = torch.full((1, CODEBOOK), -30.0).bfloat16()
    logits[0, :2] = 5.0  # equal probabilities for ids 0 and 1
    noise = torch.full((1, CODEBOOK), 100.0).bfloat16()
    noise[0, 0] = 1.4921875  # and the next bf16 below it: 0.5 / each rounds to 0.3359375
    noise[0, 1] = 1.484375
    params = BatchSampling.from_params([SamplingParams(top_p=1.0, temperature=1.0)])
    probs = torch.softmax(logits, dim=-1)
    assert int(torch.argmax(probs.float() / noise.float(), dim=-1)) == 1  # unrounded
    want = python_draw(logits, params, None, noise)
    assert int(want) == 0
    assert torch.equal(fused_draw(logits, params, None, noise), want)
