"""``streamtts bench --profile``: where the codebook pass's time goes, op by op.

The codebook pass (the fast transformer's positions and the sampling of each codebook, for
one frame at batch 1, as a decode step runs it) is run under :mod:`torch.profiler`. Each op's
self time is per pass; ``outside_ops_ms`` is the pass's wall time under the profiler minus the
ops' self times: Python, dispatch and the profiler's own cost. The profiler slows small ops,
so the shares say where time goes, the bench's ``fast_ms_b1`` (no profiler) what it costs.
``matrix_products_ms`` is the self time of the weight products (every layer's linear, packed or
not, int8 or not): with the pass's weight bytes it gives the rate those kernels stream weights
at, set against the memory bandwidth by the bench.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch.profiler import ProfilerActivity, profile

PROFILED_PASSES = 20
TOP_OPS = 15
# The ops a linear layer runs as, by kind: plain, oneDNN-packed, int8 weight-only.
MATRIX_PRODUCT_OPS = frozenset(
    {
        "aten::addmm",
        "aten::mm",
        "mkldnn::_linear_pointwise",
        "aten::_weight_int8pack_mm",
        "streamtts_fused::row_linear",
    }
)


def start_profiler_here() -> None:
    """Profile nothing once on the calling thread. The profiler's backend (kineto) takes the
    first thread that profiles as its own; profiled first from another thread (the engine's,
    where :func:`op_profile` runs) it prints "ERROR: External init callback must run in same
    thread as registerClient", though the profile is complete. Called on the main thread
    before, it prints nothing."""
    with profile(activities=[ProfilerActivity.CPU]):
        pass


def op_profile(frame: Callable[[], object], passes: int = PROFILED_PASSES) -> dict[str, Any]:
    """Profile ``frame()`` (one codebook pass) ``passes`` times after a warm-up."""
    frame()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started_s = time.perf_counter()
        for _ in range(passes):
            frame()
        wall_ms = 1000 * (time.perf_counter() - started_s) / passes
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    self_ms = sum(e.self_cpu_time_total for e in events) / 1000 / passes
    products_us = sum(e.self_cpu_time_total for e in events if e.key in MATRIX_PRODUCT_OPS)
    ops = [
        {
            "op": e.key,
            "calls": round(e.count / passes, 1),
            "self_ms": round(e.self_cpu_time_total / 1000 / passes, 3),
            "share": round(e.self_cpu_time_total / 1000 / passes / wall_ms, 3),
        }
        for e in events[:TOP_OPS]
    ]
    return {
        "wall_ms_profiled": round(wall_ms, 2),
        "ops_self_ms": round(self_ms, 2),
        "outside_ops_ms": round(wall_ms - self_ms, 2),
        "matrix_products_ms": round(products_us / 1000 / passes, 3),
        "ops": ops,
    }
