"""Device placement for the engine's worker threads: one code path for CPU and CUDA.

On CUDA each worker runs on its own stream and hands tensors over with events, so the vocoder
overlaps the next decode step without a host synchronisation. On CPU these are no-ops and the
two threads overlap through torch's GIL-free kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceContext:
    device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @contextlib.contextmanager
    def worker_stream(self, name: str) -> Iterator[None]:
        """Run the calling thread's work on a stream of its own (CUDA) or as is (CPU)."""
        if not self.is_cuda:
            yield
            return
        torch.cuda.set_device(self.device)
        with torch.cuda.stream(torch.cuda.Stream(self.device)):  # type: ignore[no-untyped-call]
            yield

    def record(self) -> torch.cuda.Event | None:
        """Mark the point in the current stream after which handed-over tensors are ready."""
        if not self.is_cuda:
            return None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return event

    def wait(self, event: torch.cuda.Event | None, *tensors: torch.Tensor) -> None:
        """Make the current stream wait for ``event``; keep ``tensors`` alive for it."""
        if event is None:
            return
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)
        for tensor in tensors:
            tensor.record_stream(stream)


def set_cpu_threads(threads: int) -> None:
    """Intra-op threads for all torch work in the process (0: torch's default, one per core).

    This is process-wide: torch's thread count is not per calling thread (measured: a worker
    thread setting 1 made the generator thread run single-threaded), so both workers share
    one setting.
    """
    if threads > 0:
        torch.set_num_threads(threads)


def choose_device(requested: str) -> torch.device:
    """``auto``: the first CUDA device if there is one, else the CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def choose_dtype(requested: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on CUDA and on CPUs with native bf16 (AVX512-BF16/AMX), else fp32."""
    named = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    if requested != "auto":
        if requested not in named:
            raise ValueError(f"dtype must be auto, bf16, fp16, fp32 or int8, got {requested!r}")
        return named[requested]
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if _cpu_has_native_bf16() else torch.float32


def _cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = cpuinfo.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
