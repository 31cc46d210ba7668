"""Batched token sampling with upstream Fish-Speech 1.5 semantics (spec §4.2).

Order: repetition penalty over the window → top-p on the *untempered* logits → temperature →
softmax → exponential race ``argmax(probs / q)``, ``q ~ Exponential(1)``. Everything stays in the
logits dtype. Upstream holds the parameters as 0-dim float32 tensors; against bf16 logits those
behave as follows (checked against torch, see tests): ``*`` and ``/`` are computed in float32
and rounded once to the logits dtype, while the top-p comparison rounds ``p`` to the logits
dtype first. The batched code below reproduces exactly that with per-sequence ``[B]`` tensors.

Random draws come in as ``noise`` (:func:`draw_noise`: ``Exponential(1)`` samples of the
logits' shape and dtype), drawn by the caller before the sampling runs, so a compiled graph
holds no random number generator and a seeded stream draws from its own generator whatever
batch it is in. With batch 1 from the default generator the draws are upstream's: one
``exponential_`` of the logits' shape per sampled token, in upstream's order. The engine asks
for faster draws for its unseeded streams (``upstream_draws=False``), whose values need not be
upstream's. No host synchronisation.

Top-p over the 102048-token vocabulary in bf16 uses a counting sort instead of upstream's
comparison sort (:func:`top_p_filter_by_counting`; 5.7 → 0.9 ms per row on the dev CPU): the
same number of tokens is kept, and the same tokens unless equal logits straddle the cut. In
fp32 on the CPU (``dtype auto`` or ``int8`` where the CPU has no native bf16) it sorts the
values alone, with NumPy's vectorized sort (:func:`top_p_filter_by_value_sort`; 9.7 → 0.5 ms
per row on a Zen 3), with the same guarantee.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from streamtts.options import BY_NAME

_DEFAULTS: dict[str, float] = {
    name: float(BY_NAME[name].default)  # type: ignore[arg-type]
    for name in ("temperature", "top_p", "repetition_penalty")
}
MIN_TEMPERATURE = 1e-5
# From this vocabulary size on, 16-bit logits are filtered by counting, not sorting.
COUNTING_MIN_VOCAB = 8192


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling settings; defaults and ranges are the option table's (upstream's
    API defaults and the bounds upstream asserts). ``seed``: the sequence draws from its own
    generator seeded with it; ``None``: from the default generator."""

    temperature: float = _DEFAULTS["temperature"]
    top_p: float = _DEFAULTS["top_p"]
    repetition_penalty: float = _DEFAULTS["repetition_penalty"]
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "repetition_penalty", "seed"):
            value = getattr(self, name)
            if value is not None:
                BY_NAME[name].check(value)  # raises OptionError (a ValueError) naming it


@dataclass(frozen=True)
class BatchSampling:
    """Sampling parameters of a batch as float32 tensors ``[B]`` on the model's device."""

    temperature: torch.Tensor  # [B] float32
    top_p: torch.Tensor  # [B] float32
    repetition_penalty: torch.Tensor  # [B] float32

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], device: torch.device | str = "cpu"
    ) -> BatchSampling:
        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return cls(
            temperature=column([p.temperature for p in params]),
            top_p=column([p.top_p for p in params]),
            repetition_penalty=column([p.repetition_penalty for p in params]),
        )

    def select(self, rows: torch.Tensor) -> BatchSampling:
        """The parameters of a subset of rows (``rows``: [B'] long)."""
        return BatchSampling(
            temperature=self.temperature.index_select(0, rows),
            top_p=self.top_p.index_select(0, rows),
            repetition_penalty=self.repetition_penalty.index_select(0, rows),
        )


def apply_repetition_penalty(
    logits: torch.Tensor, window: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """Penalise the ids in ``window``: ×r where the logit is < 0, ÷r otherwise.

    logits: [B, V]; window: [B, W] int (duplicates are penalised once); penalty: [B] float32.
    """
    index = window.long()  # [B, W]
    score = logits.gather(-1, index).float()  # [B, W]
    r = penalty[:, None]  # [B, 1]
    score = torch.where(score < 0, score * r, score / r).to(logits.dtype)  # [B, W]
    return logits.scatter(-1, index, score)


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit outside the nucleus of mass ``top_p`` (the top one always stays).

    logits: [B, V]; top_p: [B] float32 (rounded to the logits dtype for the comparison).
    16-bit logits over a large vocabulary take :func:`top_p_filter_by_counting`.
    """
    if logits.shape[-1] >= COUNTING_MIN_VOCAB:
        if logits.element_size() == 2:
            return top_p_filter_by_counting(logits, top_p)
        if _sorts_values_on_host(logits):
            return top_p_filter_by_value_sort(logits, top_p)
    return top_p_filter_by_sorting(logits, top_p)


def _sorts_values_on_host(logits: torch.Tensor) -> bool:
    """fp32 rows on the CPU, outside a compiled graph (NumPy is not traced)."""
    return (
        logits.dtype == torch.float32
        and logits.device.type == "cpu"
        and not torch.compiler.is_compiling()
    )


def _past_nucleus(sorted_logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Upstream's cut on descending logits [B, V]: True where the cumulated softmax exceeds
    ``top_p`` (rounded to the logits dtype), never at the top one. Both filters share it, so
    they keep the same number of tokens."""
    cum_probs = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)  # [B, V]
    remove_sorted = cum_probs > top_p.to(cum_probs.dtype)[:, None]  # [B, V]
    remove_sorted[:, 0] = False
    return remove_sorted


def top_p_filter_by_sorting(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Upstream's way: sort the row, cumulate the softmax, drop what lies past ``top_p``."""
    sorted_logits, sorted_index = torch.sort(logits, dim=-1, descending=True)  # [B, V]
    remove_sorted = _past_nucleus(sorted_logits, top_p)  # [B, V]
    remove = remove_sorted.scatter(-1, sorted_index, remove_sorted)  # [B, V], vocab order
    return logits.masked_fill(remove, float("-inf"))


def top_p_filter_by_counting(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """:func:`top_p_filter_by_sorting` for 16-bit logits, with a counting sort.

    A 16-bit float has 65536 bit patterns, so the descending sorted *values* follow from a
    histogram of the patterns, without a comparison sort (upstream's ``torch.sort`` of a
    102048-entry row takes 5 ms on the dev CPU, per row). The cumulated softmax of those values
    is computed by the same kernels on the same sequence, so the number of kept tokens is
    exactly upstream's. Only which of several *equal* logits straddling the cut stay can
    differ: upstream's unstable sort picks arbitrarily, this keeps the lowest ids. No host sync.

    Where the fused ops' library is loaded (:mod:`streamtts.models.fish.fused`, as the engine
    loads it for its fused ops on the CPU), CPU rows take its ``top_p_by_counting``: the same
    softmax and cumulated sum, the rest in plain loops, the same result bits (tested), in about
    a third of the time.

    logits: [B, V] bf16/fp16; top_p: [B] float32 → [B, V].
    """
    if logits.device.type == "cpu" and not torch.compiler.is_compiling() and _counting_op():
        filtered: torch.Tensor = torch.ops.streamtts_fused.top_p_by_counting(logits, top_p)
        return filtered
    b, v = logits.shape
    device = logits.device
    table = float16_values_descending(logits.dtype, device)  # [P], P = 65536
    patterns = table.shape[0]
    rank = descending_rank(logits)  # [B, V] int32: 0 = largest value
    row_offset = torch.arange(b, device=device, dtype=torch.int32)[:, None] * patterns  # [B, 1]
    counts = _histogram((rank + row_offset).flatten(), b * patterns)  # [B*P]
    sorted_logits = table.repeat(b).repeat_interleave(counts, output_size=b * v).view(b, v)
    kept = _kept_count(sorted_logits, top_p)  # [B, 1]
    cut_rank = descending_rank(sorted_logits.gather(-1, kept - 1))  # [B, 1] last kept value
    # rank < cut_rank: strictly larger than the cut value.
    return _keep_through_cut(logits, rank < cut_rank, rank == cut_rank, kept)


def _counting_op() -> bool:
    """Whether the fused ops' library, with ``top_p_by_counting``, is loaded in this process."""
    return hasattr(torch.ops.streamtts_fused, "top_p_by_counting")


def _sample_op_applies(logits: torch.Tensor) -> bool:
    """16-bit CPU rows of a vocabulary under ``COUNTING_MIN_VOCAB``, outside a compiled graph,
    with the fused ops' ``sample_tokens`` loaded."""
    return (
        logits.element_size() == 2
        and logits.shape[-1] < COUNTING_MIN_VOCAB
        and logits.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and hasattr(torch.ops.streamtts_fused, "sample_tokens")
    )


def top_p_filter_by_value_sort(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """:func:`top_p_filter_by_sorting` for fp32 CPU rows, sorting the values alone.

    The cut depends only on the sorted *values*, not on which token holds each: NumPy sorts
    values without indices with SIMD kernels (0.5 ms for a 102048-entry row on a Zen 3, where
    ``torch.sort``, which also sorts the indices, takes 9.7 ms). The cumulated softmax runs on
    the same values in the same order as upstream's, so the number of kept tokens is exactly
    upstream's; tokens are then kept by comparing with the cut value, and of several equal
    logits straddling the cut the lowest ids stay (as :func:`top_p_filter_by_counting`).

    logits: [B, V] float32 on the CPU; top_p: [B] float32 → [B, V].
    """
    rows = logits.detach().numpy()  # [B, V], shares memory
    ascending = np.sort(rows, axis=-1)  # [B, V]
    sorted_logits = torch.from_numpy(np.ascontiguousarray(ascending[:, ::-1]))  # descending
    kept = _kept_count(sorted_logits, top_p)  # [B, 1]
    cut = sorted_logits.gather(-1, kept - 1)  # [B, 1] the last kept value
    return _keep_through_cut(logits, logits > cut, logits == cut, kept)


def _kept_count(sorted_logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """How many tokens upstream's cut keeps, from the descending logits [B, V] → [B, 1] ≥ 1."""
    remove_sorted = _past_nucleus(sorted_logits, top_p)  # [B, V], a suffix
    return sorted_logits.shape[-1] - remove_sorted.sum(dim=-1, keepdim=True)


def _keep_through_cut(
    logits: torch.Tensor, above: torch.Tensor, at_cut: torch.Tensor, kept: torch.Tensor
) -> torch.Tensor:
    """Keep the ``kept`` [B, 1] largest logits [B, V]: every one ``above`` the cut value and,
    of those ``at_cut`` (equal to it), the lowest ids; the rest become -inf."""
    room = kept - above.sum(dim=-1, keepdim=True)  # [B, 1] how many cut-value tokens stay
    keep = above | (at_cut & (torch.cumsum(at_cut, dim=-1) <= room))
    return logits.masked_fill(keep.logical_not(), float("-inf"))


def _histogram(index: torch.Tensor, bins: int, sync_free: bool | None = None) -> torch.Tensor:
    """Occurrences of each value of ``index`` [N] in ``[0, bins)`` → [bins] int64.

    ``bincount`` is the fastest on the CPU, but on CUDA it reads the maximum back to the host;
    ``scatter_add_`` into a preallocated range does not (``sync_free``: default off the CPU).
    """
    if sync_free is None:
        sync_free = index.device.type != "cpu"
    if not sync_free:
        return torch.bincount(index, minlength=bins)
    counts = torch.zeros(bins, dtype=torch.int64, device=index.device)
    return counts.scatter_add_(0, index.long(), torch.ones_like(index, dtype=torch.int64))


def descending_rank(x: torch.Tensor) -> torch.Tensor:
    """16-bit floats → int32 in [0, 65535], ordered like the values, largest first.

    Sign-magnitude patterns: a non-negative one rises with the value and ranks ``32767 - bits``
    (its low 15 bits flipped); a negative one falls with it and ranks ``bits + 65536`` (the
    same bits read unsigned). In 16-bit integer ops, a tenth of a ``where`` over int32.
    """
    bits = x.view(torch.int16)
    negative = torch.bitwise_right_shift(bits, 15)  # -1 where negative, else 0
    flipped = torch.bitwise_xor(bits, torch.bitwise_and(torch.bitwise_not(negative), 0x7FFF))
    return flipped.int().bitwise_and_(0xFFFF)


_VALUE_TABLES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def float16_values_descending(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every 16-bit pattern's value, indexed by :func:`descending_rank`: [65536] in ``dtype``."""
    key = (dtype, device)
    if key not in _VALUE_TABLES:
        patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
        table = torch.empty_like(patterns)
        table[descending_rank(patterns)] = patterns
        _VALUE_TABLES[key] = table.to(device)
    return _VALUE_TABLES[key]


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``logits / max(τ, 1e-5)`` computed in float32, rounded to the logits dtype. [B, V]."""
    tau = temperature.clamp_min(MIN_TEMPERATURE)[:, None]  # [B, 1]
    return (logits.float() / tau).to(logits.dtype)


Generators = Sequence[torch.Generator | None]


def draw_noise(
    noise: torch.Tensor, generators: Generators = (), upstream_draws: bool = True
) -> torch.Tensor:
    """Fill ``noise`` [B, ...] with ``Exponential(1)`` draws in place and return it.

    One ``exponential_`` over the whole tensor from the default generator, then each row with
    a generator of its own (``generators[i]``, or ``None``) drawn again from it, so a seeded row
    does not depend on the rest of the batch.

    Without ``upstream_draws`` the default generator's share is ``-log(U)`` instead, ``U``
    uniform in fp32 (``Exponential(1)`` as well, for ``U`` on 2^-24 steps: at most 16.6, or
    infinite for ``U = 0``, which no token wins with): on the dev CPU the slow token's 102 048
    draws took 0.35 ms so, against 2.0 ms by ``exponential_``, which draws in double precision.
    The values are not upstream's; a seeded row's still are.
    """
    if upstream_draws:
        noise.exponential_(1)
    else:
        uniform = torch.rand(noise.shape, device=noise.device)  # fp32 in [0, 1)
        noise.copy_(uniform.log_().neg_())
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(1, generator=generator)
    return noise


def exponential_race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``argmax(probs / q)``, ``q ~ Exponential(1)`` (``noise``): a multinomial draw.
    [B, V] → [B] int64.

    On the CPU a 16-bit argmax is a scalar loop (378 µs over the 102048 slow logits on the dev
    CPU, 73 µs widened to fp32 first); the widened values are the same, and so is the first
    index of their maximum.
    """
    race = probs / noise
    if race.device.type == "cpu":
        race = race.float()
    return torch.argmax(race, dim=-1)


def sample(
    logits: torch.Tensor,
    params: BatchSampling,
    window: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw one id per row. logits: [B, V]; window: [B, W] previous ids or None; noise: [B, V]
    ``Exponential(1)`` draws in the logits dtype (drawn here from the default generator when
    ``None``) → [B] int64.

    Where the fused ops' library is loaded, 16-bit CPU rows of a vocabulary sorted by sorting
    (a codebook's 1024) take its ``sample_tokens``: the same draw in one call (the softmaxes and
    the cumulated sum are the same ATen calls, the rest plain loops with the same roundings)
    and, at the cut, the counting filter's rule: of equal logits straddling it, the lowest ids
    stay, where sorting leaves that to the sort. A large vocabulary (the slow token's) keeps
    the calls below, whose kernels share a row between threads: as fast for one row, faster
    for several."""
    if _sample_op_applies(logits):
        if noise is None:
            noise = draw_noise(torch.empty_like(logits))
        drawn: torch.Tensor = torch.ops.streamtts_fused.sample_tokens(
            logits,
            params.temperature,
            params.top_p,
            params.repetition_penalty,
            window,
            noise,
        )
        return drawn
    if window is not None:
        logits = apply_repetition_penalty(logits, window, params.repetition_penalty)
    logits = top_p_filter(logits, params.top_p)
    logits = apply_temperature(logits, params.temperature)
    probs = torch.softmax(logits, dim=-1)  # [B, V]
    if noise is None:
        noise = draw_noise(torch.empty_like(probs))
    return exponential_race(probs, noise)
