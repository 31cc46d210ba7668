"""Sampling: upstream order and dtype behaviour, per-row batched parameters, RNG consumption."""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch

from streamtts.models.fish.llm import sampling
from streamtts.models.fish.llm.generate import (
    WINDOW_FRAMES,
    RepetitionWindows,
    frame_noise,
    prefill_frame,
)
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.sampling import (
    COUNTING_MIN_VOCAB,
    BatchSampling,
    SamplingParams,
    _histogram,
    apply_repetition_penalty,
    apply_temperature,
    descending_rank,
    exponential_race,
    float16_values_descending,
    sample,
    top_p_filter,
    top_p_filter_by_counting,
    top_p_filter_by_sorting,
    top_p_filter_by_value_sort,
)
from streamtts.models.fish.llm.synthetic import load_synthetic


def upstream_style_sample(
    logits: torch.Tensor, window: torch.Tensor | None, params: SamplingParams
) -> torch.Tensor:
    """Spec §4.2 on one 1-D row with 0-dim float32 parameters, as upstream holds them."""
    r = torch.tensor(params.repetition_penalty)
    p = torch.tensor(params.top_p)
    tau = torch.tensor(params.temperature)
    logits = logits.clone()
    if window is not None:
        score = torch.gather(logits, 0, window)
        score = torch.where(score < 0, score * r, score / r)
        logits.scatter_(0, window, score)
    sorted_logits, sorted_index = torch.sort(logits, descending=True)
    cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cum > p
    remove[0] = False
    logits = logits.masked_fill(remove.scatter(0, sorted_index, remove), float("-inf"))
    logits = logits / torch.clip(tau, min=1e-5)
    probs = torch.softmax(logits, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", [SamplingParams(0.7, 0.7, 1.2), SamplingParams(0.9, 0.8, 1.3)])
def test_batch_of_one_matches_upstream_semantics_and_rng(
    dtype: torch.dtype, params: SamplingParams
) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(3000, generator=gen) * 4).to(dtype)
    window = torch.randint(0, 3000, (16,), generator=gen)
    batch = BatchSampling.from_params([params])
    for use_window in (True, False):
        w = window if use_window else None
        torch.manual_seed(5)
        expected = [upstream_style_sample(logits, w, params) for _ in range(20)]
        torch.manual_seed(5)
        got = [sample(logits[None], batch, None if w is None else w[None])[0] for _ in range(20)]
        assert [int(x) for x in got] == [int(x) for x in expected]


def test_penalty_and_temperature_round_once_from_float32() -> None:
    logits = (torch.randn(1, 50000) * 5).bfloat16()
    window = torch.arange(16)[None]
    penalty = torch.tensor([1.2])
    got = apply_repetition_penalty(logits, window, penalty)
    ref = logits[0, :16].float()
    ref = torch.where(ref < 0, ref * 1.2, ref / torch.tensor(1.2)).bfloat16()
    assert torch.equal(got[0, :16], ref)
    assert torch.equal(got[0, 16:], logits[0, 16:])
    tempered = apply_temperature(logits, torch.tensor([0.7]))
    assert torch.equal(tempered, logits / torch.tensor(0.7))  # 0-dim fp32 tensor semantics


def test_repetition_penalty_duplicates_once() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = apply_repetition_penalty(logits, torch.tensor([[0, 0, 1, 0]]), torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_top_p_removes_mass_above_p_but_keeps_first() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0]])
    kept = top_p_filter(logits, torch.tensor([1e-4]))
    assert torch.isinf(kept).tolist() == [[True, False, True, True]]
    wide = top_p_filter(logits, torch.tensor([0.997]))  # cum: 0.523, 0.996, 0.9998, 1
    assert torch.isfinite(wide).sum() == 2


def test_per_row_parameters() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0]]).repeat(2, 1)
    batch = BatchSampling.from_params([SamplingParams(top_p=0.0001), SamplingParams(top_p=1.0)])
    filtered = top_p_filter(logits, batch.top_p)
    assert torch.isfinite(filtered).sum(dim=1).tolist() == [1, 4]
    picks = {int(sample(logits, batch)[1]) for _ in range(200)}
    assert picks >= {1, 2}
    assert all(int(sample(logits, batch)[0]) == 1 for _ in range(50))


def test_one_draw_per_call() -> None:
    logits = torch.randn(4, 1024)
    batch = BatchSampling.from_params([SamplingParams()] * 4)
    torch.manual_seed(3)
    sample(logits, batch)
    after = torch.rand(1)
    torch.manual_seed(3)
    torch.empty(4, 1024).exponential_(1)
    assert torch.equal(after, torch.rand(1))


def test_invalid_params_rejected() -> None:
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(repetition_penalty=2.0)


def test_ring_window_equals_upstream_window() -> None:
    rows, steps = 3, 40
    frames = torch.randint(0, 50, (steps, rows))
    windows = RepetitionWindows(slots=2, rows=rows)
    prev = torch.zeros(rows, steps, dtype=torch.int64)
    slot = torch.tensor([1])
    for i in range(steps):
        upstream = prev[:, :WINDOW_FRAMES] if i < WINDOW_FRAMES else prev[:, i - WINDOW_FRAMES : i]
        ring = windows.gather(slot)[0]
        for row in range(rows):
            assert sorted(ring[row].tolist()) == sorted(upstream[row].tolist())
        windows.push(slot, torch.tensor([i]), frames[i][None])
        prev[:, i] = frames[i]
    assert int(windows.buffer[0].abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_frame_consumes_rng_like_upstream(dtype: torch.dtype) -> None:
    """Batch 1: one draw of size V (slow), then one of size K per codebook 1.. (spec §4.2)."""
    llm = load_synthetic("tiny", dtype, seed=4)
    model, cfg = llm.model, llm.model.config
    prompt = PromptBuilder(llm.tokenizer, cfg.num_codebooks).build("Hello.")
    cache = model.allocate_cache(1)
    sampling = BatchSampling.from_params([SamplingParams()])
    torch.manual_seed(11)
    prefill_frame(model, cache, prompt, 0, sampling)
    after_frame = torch.rand(4)
    torch.manual_seed(11)
    torch.empty(cfg.vocab_size, dtype=dtype).exponential_(1)
    for _ in range(cfg.num_codebooks - 1):
        torch.empty(cfg.codebook_size, dtype=dtype).exponential_(1)
    assert torch.equal(after_frame, torch.rand(4))


def test_a_seeded_row_draws_from_its_own_generator_in_upstreams_order() -> None:
    """Row 1 of a batch with its own generator gets what that generator gives alone, in
    upstream's order (size V, then K per codebook); rows without one use the default."""
    model = load_synthetic("tiny", torch.float32, seed=4).model
    cfg = model.config
    noise = frame_noise(model, 3, [None, torch.Generator().manual_seed(9), None])
    solo = torch.Generator().manual_seed(9)
    assert torch.equal(noise.slow[1], torch.empty(cfg.vocab_size).exponential_(1, generator=solo))
    for k in range(cfg.num_codebooks - 1):
        want = torch.empty(cfg.codebook_size).exponential_(1, generator=solo)
        assert torch.equal(noise.fast[1, k], want)
    assert not torch.equal(noise.slow[0], noise.slow[1])
    assert bool((noise.slow > 0).all()) and bool((noise.fast > 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_faster_draws_are_exponential_and_leave_seeded_rows_upstreams(dtype: torch.dtype) -> None:
    """Without upstream's draws, default-generator rows are Exponential(1) (Kolmogorov-Smirnov
    distance and mean over 300 000 draws), positive, reproducible from the default seed and
    not upstream's values; a seeded row still draws what its generator gives alone."""

    def filled(upstream_draws: bool) -> torch.Tensor:
        torch.manual_seed(5)
        generators = [None, torch.Generator().manual_seed(9), None, None]
        noise = torch.empty(4, 100_000, dtype=dtype)
        return sampling.draw_noise(noise, generators, upstream_draws)

    noise, again, upstreams = filled(False), filled(False), filled(True)
    assert torch.equal(noise, again) and not torch.equal(noise[0], upstreams[0])
    assert torch.equal(noise[1], upstreams[1])
    draws = noise[[0, 2, 3]].flatten().double().sort().values  # [300 000]
    assert bool((draws > 0).all())
    empirical = torch.arange(1, draws.numel() + 1, dtype=torch.float64) / draws.numel()
    distance = float((empirical - (1 - torch.exp(-draws))).abs().max())
    # 1.63 / sqrt(n) is the 1% critical value; bf16 rounding moves the CDF by < 2^-9 relative
    assert distance < 1.63 / draws.numel() ** 0.5 + (0.004 if dtype == torch.bfloat16 else 0)
    assert abs(float(draws.mean()) - 1) < 0.01


def test_the_race_over_faster_draws_samples_the_distribution() -> None:
    """20 000 rows of one distribution: each token won within 4 standard deviations."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0]).expand(20_000, 5)
    torch.manual_seed(7)
    noise = sampling.draw_noise(torch.empty(20_000, 5), upstream_draws=False)
    wins = torch.bincount(exponential_race(probs, noise), minlength=5).double()
    expected = probs[0].double() * 20_000
    assert bool(((wins - expected).abs() <= 4 * (expected * (1 - probs[0])).sqrt()).all())
    assert int(wins[4]) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def testdescending_rank_orders_every_16_bit_value(dtype: torch.dtype) -> None:
    patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    finite = patterns[torch.isfinite(patterns)]
    rank = descending_rank(finite)
    assert sorted(set(rank.tolist())) == sorted(rank.tolist())  # one rank per pattern
    by_rank = finite[rank.argsort()].float()
    assert bool((by_rank[:-1] >= by_rank[1:]).all())  # ±0 tie, everything else strictly falls
    assert torch.equal(float16_values_descending(dtype, finite.device)[rank], finite)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [0.05, 0.64, 4.0, 30.0])
def test_counting_filter_keeps_what_sorting_keeps(dtype: torch.dtype, scale: float) -> None:
    """Same kept count always; the same set up to equal logits straddling the cut."""
    gen = torch.Generator().manual_seed(int(scale * 100))
    for trial in range(12):
        logits = (torch.randn(3, 20000, generator=gen) * scale).to(dtype)
        logits[0, trial] = 40.0  # one dominant token in row 0
        top_p = torch.rand(3, generator=gen) * 0.98 + 0.01
        by_sort = torch.isfinite(top_p_filter_by_sorting(logits, top_p))
        by_count = torch.isfinite(top_p_filter_by_counting(logits, top_p))
        assert torch.equal(by_sort.sum(-1), by_count.sum(-1))
        for row in range(3):
            cut = logits[row][by_count[row]].float().min()
            differ = by_sort[row] != by_count[row]
            assert bool((logits[row][differ].float() == cut).all())  # only ties at the cut
            assert bool((logits[row][~by_count[row]].float() <= cut).all())
            assert bool(by_count[row][logits[row].float() > cut].all())


def test_counting_filter_edges() -> None:
    logits = (torch.randn(2, 9000) * 2).bfloat16()
    everything = top_p_filter_by_counting(logits, torch.tensor([1.0, 1.0]))
    assert bool(torch.isfinite(everything).all())
    only_top = torch.isfinite(top_p_filter_by_counting(logits, torch.tensor([1e-6, 1e-6])))
    assert only_top.sum(-1).tolist() == [1, 1]
    assert torch.equal(only_top.float().argmax(-1), logits.float().argmax(-1))
    flat = torch.zeros(1, 9000, dtype=torch.bfloat16)  # all tied: the lowest ids stay
    kept = torch.isfinite(top_p_filter_by_counting(flat, torch.tensor([0.5])))
    assert kept[0].nonzero().flatten().tolist() == list(range(int(kept.sum())))


def test_large_vocabularies_take_the_counting_or_value_sorting_filter() -> None:
    logits = (torch.randn(1, COUNTING_MIN_VOCAB) * 3).bfloat16()
    top_p = torch.tensor([0.6])
    assert torch.equal(top_p_filter(logits, top_p), top_p_filter_by_counting(logits, top_p))
    small = logits[:, :1000]
    assert torch.equal(top_p_filter(small, top_p), top_p_filter_by_sorting(small, top_p))
    wide = logits.float()  # fp32 on the CPU: the values sorted alone
    spy = patch.object(sampling, "top_p_filter_by_value_sort", wraps=top_p_filter_by_value_sort)
    with spy as value_sort:
        assert torch.equal(top_p_filter(wide, top_p), top_p_filter_by_sorting(wide, top_p))
        assert value_sort.call_count == 1
        narrow = wide[:, :1000]
        assert torch.equal(top_p_filter(narrow, top_p), top_p_filter_by_sorting(narrow, top_p))
        assert value_sort.call_count == 1


@pytest.mark.parametrize("scale", [0.05, 0.64, 4.0, 30.0])
def test_value_sorting_filter_keeps_what_sorting_keeps(scale: float) -> None:
    """fp32: the same kept count always; the same set up to equal logits straddling the cut
    (made likely here by rounding some rows to coarse steps)."""
    gen = torch.Generator().manual_seed(int(scale * 100) + 1)
    for trial in range(12):
        logits = torch.randn(3, 20000, generator=gen) * scale
        logits[0, trial] = 40.0  # one dominant token in row 0
        logits[2] = (logits[2] * 8).round() / 8  # many ties
        top_p = torch.rand(3, generator=gen) * 0.98 + 0.01
        by_sort = torch.isfinite(top_p_filter_by_sorting(logits, top_p))
        by_value = torch.isfinite(top_p_filter_by_value_sort(logits, top_p))
        assert torch.equal(by_sort.sum(-1), by_value.sum(-1))
        for row in range(3):
            cut = logits[row][by_value[row]].min()
            differ = by_sort[row] != by_value[row]
            assert bool((logits[row][differ] == cut).all())  # only ties at the cut
            assert bool((logits[row][~by_value[row]] <= cut).all())
            assert bool(by_value[row][logits[row] > cut].all())


def test_value_sorting_filter_edges() -> None:
    gen = torch.Generator().manual_seed(9)  # a draw whose rows both lose a few (see below)
    logits = torch.randn(2, 9000, generator=gen) * 2
    # top_p 1 keeps what upstream keeps: all but the tail whose fp32 cumulated probability
    # rounds past 1 (it depends on the draw: about half of random rows lose a few tokens).
    nearly_all = torch.isfinite(top_p_filter_by_value_sort(logits, torch.tensor([1.0, 1.0])))
    reference = torch.isfinite(top_p_filter_by_sorting(logits, torch.tensor([1.0, 1.0])))
    assert torch.equal(nearly_all, reference)
    assert int(nearly_all.sum()) > 0.99 * logits.numel()
    only_top = torch.isfinite(top_p_filter_by_value_sort(logits, torch.tensor([1e-6, 1e-6])))
    assert only_top.sum(-1).tolist() == [1, 1]
    assert torch.equal(only_top.float().argmax(-1), logits.argmax(-1))
    flat = torch.zeros(1, 9000)  # all tied: the lowest ids stay
    kept = torch.isfinite(top_p_filter_by_value_sort(flat, torch.tensor([0.5])))
    assert kept[0].nonzero().flatten().tolist() == list(range(int(kept.sum())))
    penalised = logits.clone()
    penalised[:, :100] = float("-inf")  # never kept, and the rest is filtered as without them
    got = torch.isfinite(top_p_filter_by_value_sort(penalised, torch.tensor([0.9, 0.9])))
    want = torch.isfinite(top_p_filter_by_sorting(penalised, torch.tensor([0.9, 0.9])))
    assert not bool(got[:, :100].any()) and torch.equal(got, want)


def test_histogram_paths_agree() -> None:
    index = torch.randint(0, 300, (5000,), dtype=torch.int32)
    expected = torch.bincount(index, minlength=300)
    assert torch.equal(_histogram(index, 300), expected)
    assert torch.equal(_histogram(index, 300, sync_free=True), expected)  # the CUDA form


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_race_picks_the_first_of_equal_maxima(dtype: torch.dtype) -> None:
    """Widened to fp32 for a fast argmax, the race keeps the 16-bit values and so their ties."""
    gen = torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(3, COUNTING_MIN_VOCAB, generator=gen), dim=-1).to(dtype)
    noise = torch.empty(3, COUNTING_MIN_VOCAB).exponential_(1, generator=gen).to(dtype)
    race = probs / noise
    winners = [int(race[row].float().argmax()) for row in range(3)]
    assert exponential_race(probs, noise).tolist() == winners
    probs[1, 100] = probs[1, 900] = 1.0  # a tie for the top, the lower id first
    noise[1, 100] = noise[1, 900] = 1e-3
    assert int(exponential_race(probs, noise)[1]) == 100
