"""An optional ``torch.compile`` of the per-frame codebook pass (fast transformer + sampling).

The codebook pass runs the 4-layer fast transformer at 8 positions per frame; eager, its many
small kernels are dispatch-bound. Its shapes depend only on the batch size, so it is compiled
once per batch bucket (1, 2, 4, 8, ... up to the slots) and the batch is padded up to its
bucket; on CUDA with ``mode="reduce-overhead"``, so each bucket replays as a CUDA graph.
Compiled graphs are cached on disk by inductor (``TORCHINDUCTOR_CACHE_DIR``), so later starts
reuse them. Sampling inside a compiled graph draws from inductor's RNG: seeded results differ
from eager ones; greedy results do not. Figures: docs/operations.md, "Performance".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from streamtts.models.fish.generate import fast_codes
from streamtts.models.fish.llama import DualARTransformer, KVCache
from streamtts.models.fish.sampling import BatchSampling

log = logging.getLogger(__name__)


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
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True  # weights become constants: needed for the CPU win
        self.buckets = batch_buckets(max_batch)
        # On CUDA each bucket's graph is captured and replayed as a CUDA graph: one launch per
        # frame's codebook pass instead of hundreds of kernel launches.
        mode = "reduce-overhead" if device.type == "cuda" else None
        self._compiled: Callable[..., torch.Tensor] = torch.compile(
            fast_codes, dynamic=False, mode=mode
        )
        self.compile_s: dict[int, float] = {}

    def __call__(
        self,
        model: DualARTransformer,
        cache: KVCache,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        sampling: BatchSampling,
        windows: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        b = hidden.shape[0]
        bucket = next((x for x in self.buckets if x >= b), None)
        if bucket is None or generator is not None:
            return fast_codes(model, cache, hidden, code0, sampling, windows, generator)
        args = _pad_rows(bucket, hidden, code0, sampling, windows)
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
            sampling = BatchSampling(
                temperature=torch.full((bucket,), 0.7, device=device),
                top_p=torch.full((bucket,), 0.7, device=device),
                repetition_penalty=torch.full((bucket,), 1.2, device=device),
            )
            started_s = time.perf_counter()
            self(model, cache, hidden, code0, sampling, windows)
            self.compile_s[bucket] = time.perf_counter() - started_s
            log.info(
                "compiled the codebook pass for batch %d in %.1f s", bucket, self.compile_s[bucket]
            )


def _pad_rows(
    bucket: int,
    hidden: torch.Tensor,
    code0: torch.Tensor,
    sampling: BatchSampling,
    windows: torch.Tensor | None,
) -> tuple[Any, ...]:
    """Repeat row 0 up to ``bucket`` rows; the extra rows' results are dropped."""
    b = hidden.shape[0]
    if b == bucket:
        return hidden, code0, sampling, windows
    rows = torch.cat([torch.arange(b), torch.zeros(bucket - b, dtype=torch.long)]).to(hidden.device)
    return (
        hidden.index_select(0, rows),
        code0.index_select(0, rows),
        sampling.select(rows),
        None if windows is None else windows.index_select(0, rows),
    )
