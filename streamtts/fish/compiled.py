"""Optional ``torch.compile`` of the decode step's two parts.

The codebook pass runs the 4-layer fast transformer at 8 positions per frame; eager, its many
small kernels are dispatch-bound. Its shapes depend only on the batch size, so it is compiled
once per batch bucket (1, 2, 4, 8, ... up to the slots) and the batch is padded up to its
bucket; on CUDA with ``mode="reduce-overhead"``, so each bucket replays as a CUDA graph.
Its random draws come in as an input (drawn eagerly before the step), so a compiled graph
samples with the same noise as eager code would: a seeded stream is reproducible compiled too.
It is not compiled where the model computes in fp32 on the CPU with packed layers (``auto`` on
a CPU without native bf16): the eager pass measured faster there (:func:`compiles_codebook_pass`).

The slow transformer's step is compiled too where that measured faster: int8 weights on the
CPU (19.0 -> 16.8 ms per step on the dev CPU; a packed bf16 step is faster eager, 20.9 ms,
than compiled, 23.9 ms). Its cached length changes every step, so it is compiled with dynamic
shapes: one graph for batch 1 and one for any larger batch. Its activations are fused in fp32
where eager rounds them to bf16 between kernels, so its logits differ from eager's by about
what bf16 rounding does.

Graphs of an int8 model are cached on disk (inductor's FX graph cache and AOTAutograd's cache,
under ``TORCHINDUCTOR_CACHE_DIR``), so a later start rebuilds them in seconds. Graphs of a bf16
model are compiled with freezing (weights become constants; on the CPU inductor packs them for
oneDNN, which is what makes the compiled codebook pass pay there). AOTAutograd does not cache
frozen graphs, nor inductor ones holding packed weights: on the CPU they compile anew at every
start. Figures: docs/operations.md, "Performance".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from streamtts.models.fish.llm.generate import SlowStep, fast_codes, frame_noise, slow_step
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache
from streamtts.models.fish.llm.quantize import is_int8
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams
from streamtts.models.fish.packed import is_packed

log = logging.getLogger(__name__)


def compiles_codebook_pass(model: DualARTransformer) -> bool:
    """Whether ``compile`` covers the codebook pass: everywhere but where its layers were packed
    for the eager pass, which :func:`streamtts.fish.load.prepare_llm` does under ``compile``
    only for a model computing in fp32 on the CPU (``auto`` on a CPU without native bf16).
    There the packed eager pass measured faster than a compiled one, whose frozen graphs also
    hold their own copy of the weights (Zen 3, ``synthetic:1.5``, batch 1, two rounds: 103 and
    107 ms a pass against 167 and 168 compiled, 4.3 and 4.1 frames/s end to end against 3.9
    and 3.6, peak memory 4.3 GB against 6.4)."""
    return not is_packed(model.fast_layers)


def compiles_slow_step(model: DualARTransformer) -> bool:
    """Whether ``compile`` covers the slow step too (where it measured faster than eager)."""
    return model.device.type == "cpu" and is_int8(model)


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two up to ``max_batch``, then ``max_batch`` itself."""
    buckets = [1]
    while buckets[-1] * 2 < max_batch:
        buckets.append(buckets[-1] * 2)
    if buckets[-1] < max_batch:
        buckets.append(max_batch)
    return buckets


class CompiledFastCodes:
    """A drop-in for :func:`fast_codes` that runs a compiled graph per batch bucket."""

    def __init__(self, max_batch: int, device: torch.device) -> None:
        self.buckets = batch_buckets(max_batch)
        # On CUDA each bucket's graph is captured and replayed as a CUDA graph: one launch per
        # frame's codebook pass instead of hundreds of kernel launches.
        mode = "reduce-overhead" if device.type == "cuda" else None
        self._compiled: Callable[..., torch.Tensor] = torch.compile(
            fast_codes, dynamic=False, mode=mode
        )
        self.compile_s: dict[str, float] = {}

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
        if bucket is None:
            return fast_codes(model, cache, hidden, code0, sampling, windows, noise)
        args = _pad_rows(bucket, hidden, code0, sampling, windows, noise)
        return self._compiled(model, cache, *args)[:b]  # [B, C-1]

    def warm_up(self, model: DualARTransformer, cache: KVCache) -> None:
        """Compile every bucket now (reported in the log), not on the first request."""
        device = model.device
        if device.type == "cuda":
            # The pass writes the fast KV cache in place; a CUDA graph may mutate an input only
            # if its address is static, otherwise inductor silently skips the graph.
            for tensor in (cache.fast_k, cache.fast_v):
                torch._dynamo.mark_static_address(tensor)
        for bucket in self.buckets:
            hidden = torch.zeros(bucket, model.config.dim, dtype=model.dtype, device=device)
            code0 = torch.zeros(bucket, dtype=torch.long, device=device)
            rows = model.config.num_codebooks + 1
            windows = torch.zeros(bucket, rows, 16, dtype=torch.long, device=device)
            sampling = BatchSampling.from_params([SamplingParams()] * bucket, device)
            noise = frame_noise(model, bucket).fast
            started_s = time.perf_counter()
            with compile_settings(model):
                self(model, cache, hidden, code0, sampling, windows, noise)
            elapsed_s = self.compile_s[f"codebook_b{bucket}"] = time.perf_counter() - started_s
            log.info("compiled the codebook pass for batch %d in %.1f s", bucket, elapsed_s)


def compile_slow_step(
    model: DualARTransformer, cache: KVCache, max_batch: int
) -> tuple[SlowStep, dict[str, float]]:
    """:func:`slow_step` compiled with dynamic batch size and cached length, and the seconds
    its two graphs took (batch 1, and 2 standing for any larger batch), compiled now.

    Warming up writes keys/values of junk tokens into the first slots at one position:
    harmless, as a slot's positions are written before they are read (prefill, or the step at
    them).
    """
    compiled: SlowStep = torch.compile(slow_step, dynamic=True)
    compile_s: dict[str, float] = {}
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
    return compiled, compile_s


def freezes_weights(model: DualARTransformer) -> bool:
    """Whether graphs of ``model`` are compiled with inductor's freezing.

    It pays for bf16 weights (the CPU codebook pass: 38 -> 23 ms per frame) but makes graphs
    uncacheable across starts; int8 layers gain nothing from it (a slow step takes 17.2 ms
    either way), so their graphs stay cacheable (warm start 21 -> 7 s for the slow step).
    """
    return not is_int8(model)


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
