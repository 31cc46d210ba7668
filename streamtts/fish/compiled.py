"""Optional ``torch.compile`` of the decode step's two parts.

The codebook pass runs the 4-layer fast transformer at 8 positions per frame; eager, its many
small kernels are dispatch-bound. Its shapes depend only on the batch size, so it is compiled
once per batch bucket (1, 2, 4, 8, ... up to the slots) and the batch is padded up to its
bucket; on CUDA with ``mode="reduce-overhead"``, so each bucket replays as a CUDA graph.
Its random draws come in as an input (drawn eagerly before the step), so a compiled graph
samples with the same noise as eager code would: a seeded stream is reproducible compiled too.

Where the model's layers are packed for oneDNN on the CPU (bf16 on a CPU with native bf16,
and the fp32 that ``auto`` picks on one without; :mod:`streamtts.models.fish.packed`) a graph
keeps those layers as opaque calls (``streamtts::packed_linear``: the same kernel on the same
packed weight as eager) and fuses the small ops around them. Whether that pays depends on the
CPU (fp32 on a Zen 3: no faster; on an AVX-512 Xeon 1.1-1.2x; bf16 on a Xeon with AMX:
1.2-1.35x), so there each graph is timed against the eager code once compiled and kept only if
faster: each bucket of the codebook pass (:attr:`CompiledFastCodes.eager`), and the slow
step's graph for one row and for more (:class:`TimedSlowStep`).

The slow transformer's step is compiled on the CPU for int8 weights (19.0 -> 16.8 ms per step
on the dev CPU) and for packed layers (bf16 with AMX: 77-87 -> 69 ms, timed as above). Its
cached length changes every step, so it is compiled with dynamic shapes: one graph for batch
1 and one for any larger batch. Its activations are fused in fp32 where eager rounds them to
bf16 between kernels, so its logits differ from eager's by about what bf16 rounding does.

Graphs of an int8 or a packed model are cached on disk (inductor's FX graph cache and
AOTAutograd's cache, under ``TORCHINDUCTOR_CACHE_DIR``), so a later start rebuilds them in
seconds each (bf16 with AMX, four graphs: ready 55 s after a restart, 6.5-7 min cold).
Other graphs (a bf16 model on CUDA, or the ``fp32`` parity mode on the CPU) are compiled with
freezing (weights become constants; AOTAutograd does not cache frozen graphs,
so they compile anew at every start). Figures: docs/operations.md, "Performance".
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from streamtts.models.fish.llm.generate import (
    FastCodes,
    SlowStep,
    fast_codes,
    frame_noise,
    slow_step,
)
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache, SlowOutput
from streamtts.models.fish.llm.quantize import is_int8
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams
from streamtts.models.fish.packed import is_packed

log = logging.getLogger(__name__)
# Alternating passes each of a compiled graph and the eager pass, where they are timed.
TIMING_ROUNDS = 7


def compiles_slow_step(model: DualARTransformer) -> bool:
    """Whether ``compile`` covers the slow step too: on the CPU, with int8 weights (faster
    compiled) or packed layers (timed against eager, :class:`TimedSlowStep`)."""
    return model.device.type == "cpu" and (is_int8(model) or is_packed(model.layers))


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two up to ``max_batch``, then ``max_batch`` itself."""
    buckets = [1]
    while buckets[-1] * 2 < max_batch:
        buckets.append(buckets[-1] * 2)
    if buckets[-1] < max_batch:
        buckets.append(max_batch)
    return buckets


class CompiledFastCodes:
    """A drop-in for :func:`fast_codes` that runs a compiled graph per batch bucket.

    With ``timed``, :meth:`warm_up` times each bucket's graph against the eager pass, and
    buckets whose graph is not faster run eager from then on. ``eager``: the pass those buckets
    (and batches beyond the last) run, and the graphs are timed against: :func:`fast_codes`, or
    the fused op (:mod:`streamtts.models.fish.fused`).
    """

    def __init__(
        self,
        max_batch: int,
        device: torch.device,
        timed: bool = False,
        eager: FastCodes = fast_codes,
    ) -> None:
        self.buckets = batch_buckets(max_batch)
        self.timed = timed
        self._eager = eager
        # On CUDA each bucket's graph is captured and replayed as a CUDA graph: one launch per
        # frame's codebook pass instead of hundreds of kernel launches.
        mode = "reduce-overhead" if device.type == "cuda" else None
        self._compiled: Callable[..., torch.Tensor] = torch.compile(
            fast_codes, dynamic=False, mode=mode
        )
        self.compile_s: dict[str, float] = {}
        self.pass_ms: dict[int, tuple[float, float]] = {}  # bucket -> (compiled, eager), timed
        self.eager: set[int] = set()  # buckets whose compiled graph measured no faster

    @property
    def compiled_buckets(self) -> list[int]:
        return [b for b in self.buckets if b not in self.eager]

    def __call__(
        self,
        model: DualARTransformer,
        cache: KVCache,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        sampling: BatchSampling,
        windows: torch.Tensor | None,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        b = hidden.shape[0]
        bucket = next((x for x in self.buckets if x >= b), None)
        if bucket is None or bucket in self.eager:
            return self._eager(model, cache, hidden, code0, sampling, windows, noise)
        args = _pad_rows(bucket, hidden, code0, sampling, windows, noise)
        return self._compiled(model, cache, *args)[:b]  # [B, C-1]

    def warm_up(self, model: DualARTransformer, cache: KVCache) -> None:
        """Compile every bucket now (reported in the log), not on the first request; with
        ``timed``, keep each bucket's graph only if it beats the eager pass."""
        device = model.device
        if device.type == "cuda":
            # The pass writes the fast KV cache in place; a CUDA graph may mutate an input only
            # if its address is static, otherwise inductor silently skips the graph.
            for tensor in (cache.fast_k, cache.fast_v):
                torch._dynamo.mark_static_address(tensor)
        for bucket in self.buckets:
            args = _sample_inputs(model, bucket)
            started_s = time.perf_counter()
            with compile_settings(model):
                self(model, cache, *args)
            elapsed_s = self.compile_s[f"codebook_b{bucket}"] = time.perf_counter() - started_s
            log.info("compiled the codebook pass for batch %d in %.1f s", bucket, elapsed_s)
            if self.timed:
                self._keep_if_faster(model, cache, bucket, args)

    def _keep_if_faster(
        self, model: DualARTransformer, cache: KVCache, bucket: int, args: tuple[Any, ...]
    ) -> None:
        compiled_ms, eager_ms = compare_ms(
            lambda: self._compiled(model, cache, *args),
            lambda: self._eager(model, cache, *args),
        )
        self.pass_ms[bucket] = (compiled_ms, eager_ms)
        kept = compiled_ms < eager_ms
        if not kept:
            self.eager.add(bucket)
        log.info(
            "codebook pass for batch %d: %.1f ms compiled, %.1f ms eager: %s",
            bucket,
            compiled_ms,
            eager_ms,
            "compiled" if kept else "stays eager",
        )


def _sample_inputs(model: DualARTransformer, batch: int) -> tuple[Any, ...]:
    """Inputs of one codebook pass for ``batch`` rows, drawn like a step's (timing depends on
    them: top-p keeps more tokens of flat logits)."""
    device = model.device
    gen = torch.Generator(device).manual_seed(batch)
    hidden = torch.randn(batch, model.config.dim, generator=gen, device=device)
    code0 = torch.randint(0, model.config.codebook_size, (batch,), generator=gen, device=device)
    rows = model.config.num_codebooks + 1
    windows = torch.zeros(batch, rows, 16, dtype=torch.long, device=device)
    sampling = BatchSampling.from_params([SamplingParams()] * batch, device)
    noise = frame_noise(model, batch, [gen] * batch).fast
    return hidden.to(model.dtype), code0, sampling, windows, noise


def compare_ms(
    first: Callable[[], object], second: Callable[[], object], rounds: int = TIMING_ROUNDS
) -> tuple[float, float]:
    """Median milliseconds of ``first()`` and ``second()``, run alternately (CPU: no device
    synchronisation), so a drift of the machine's speed weighs on both alike."""
    first(), second()  # warm: first runs allocate
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for fn, out in ((first, times[0]), (second, times[1])):
            started_s = time.perf_counter()
            fn()
            out.append(1000 * (time.perf_counter() - started_s))
    return statistics.median(times[0]), statistics.median(times[1])


class TimedSlowStep:
    """The slow step by batch size: one row, or more, each on its compiled graph or on the
    eager code, whichever was faster when timed at start (:func:`compile_slow_step`)."""

    def __init__(self, compiled: SlowStep, eager: SlowStep, eager_batches: set[int]) -> None:
        self.compiled = compiled
        self.eager = eager
        self.eager_batches = eager_batches  # 1: one row; 2: any larger batch

    def __call__(
        self,
        model: DualARTransformer,
        cache: KVCache,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        kv_len: int,
    ) -> SlowOutput:
        graph = min(2, int(tokens.shape[0]))
        step = self.eager if graph in self.eager_batches else self.compiled
        return step(model, cache, tokens, slots, positions, kv_len)


def compile_slow_step(
    model: DualARTransformer,
    cache: KVCache,
    max_batch: int,
    timed: bool = False,
    eager: SlowStep = slow_step,
) -> tuple[SlowStep, dict[str, float], list[str]]:
    """:func:`slow_step` compiled with dynamic batch size and cached length, compiled now: the
    step, the seconds its two graphs took (batch 1, and 2 standing for any larger batch), and
    the graphs left unused. With ``timed`` each graph is timed against ``eager`` (the Python
    step, or the fused op) by :func:`compare_ms` and used only where faster.

    Warming up writes keys/values of junk tokens into the first slots at one position:
    harmless, as a slot's positions are written before they are read (prefill, or the step at
    them).
    """
    compiled: SlowStep = torch.compile(slow_step, dynamic=True)
    compile_s: dict[str, float] = {}
    eager_batches: set[int] = set()
    device = model.device
    rows = model.config.num_codebooks + 1
    for batch in sorted({1, min(2, max_batch)}):
        tokens = torch.zeros(batch, rows, 1, dtype=torch.int32, device=device)
        slots = torch.arange(batch, device=device)
        positions = torch.full((batch,), 64, device=device)
        started_s = time.perf_counter()
        with compile_settings(model):
            compiled(model, cache, tokens, slots, positions, 65)
        elapsed_s = compile_s[f"slow_b{batch}"] = time.perf_counter() - started_s
        log.info("compiled the slow step for batch %d in %.1f s", batch, elapsed_s)
        if not timed:
            continue
        step_args = (model, cache, tokens, slots, positions, 65)
        compiled_ms, eager_ms = compare_ms(
            functools.partial(compiled, *step_args), functools.partial(eager, *step_args)
        )
        if compiled_ms >= eager_ms:
            eager_batches.add(batch)
        log.info(
            "slow step for batch %d: %.1f ms compiled, %.1f ms eager: %s",
            batch,
            compiled_ms,
            eager_ms,
            "stays eager" if batch in eager_batches else "compiled",
        )
    unused = [f"slow_b{batch}" for batch in sorted(eager_batches)]
    if len(eager_batches) == len(compile_s):
        return eager, compile_s, unused
    if eager_batches:
        return TimedSlowStep(compiled, eager, eager_batches), compile_s, unused
    return compiled, compile_s, unused


def freezes_weights(model: DualARTransformer) -> bool:
    """Whether graphs of ``model`` are compiled with inductor's freezing: where its layers are
    neither int8 nor packed (a bf16 model on CUDA, the ``fp32`` parity mode on the CPU).

    Freezing makes graphs uncacheable across starts; int8 layers gain nothing from it (a slow
    step takes 17.2 ms either way), so their graphs stay cacheable (warm start 21 -> 7 s for
    the slow step). Nor does a pass whose layers are packed already
    (:mod:`streamtts.models.fish.packed`): its graphs call them as they are, hold no copy of
    the weights, and are cacheable. (bf16 on a Xeon with AMX, 2026-12-05: a frozen codebook
    pass took 82-83 ms, one around the packed layers 59-61 ms; 4.2 against 3.0 GB resident.)
    """
    return not is_int8(model) and not is_packed(model.fast_layers)


@contextmanager
def compile_settings(model: DualARTransformer) -> Iterator[None]:
    """Compiler settings for graphs traced inside: freezing per :func:`freezes_weights`, and
    Python floats (norm epsilons, scales) kept constants, as they are. Left symbolic by
    dynamic shapes, dynamo would trace the step, find them specialised and trace it all again
    (13 s of a 34 s compile)."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    with (
        inductor_config.patch(freezing=freezes_weights(model)),
        dynamo_config.patch(specialize_float=True),
    ):
        yield


def _pad_rows(
    bucket: int,
    hidden: torch.Tensor,
    code0: torch.Tensor,
    sampling: BatchSampling,
    windows: torch.Tensor | None,
    noise: torch.Tensor,
) -> tuple[Any, ...]:
    """Repeat row 0 up to ``bucket`` rows; the extra rows' results are dropped."""
    b = hidden.shape[0]
    if b == bucket:
        return hidden, code0, sampling, windows, noise
    # Built on the device: a host-made index would cost a blocking copy per step on a GPU.
    rows = torch.arange(bucket, device=hidden.device)
    rows = rows.masked_fill(rows >= b, 0)  # [bucket]: 0..b-1, then 0
    return (
        hidden.index_select(0, rows),
        code0.index_select(0, rows),
        sampling.select(rows),
        None if windows is None else windows.index_select(0, rows),
        noise.index_select(0, rows),
    )
