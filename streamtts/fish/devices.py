"""Device placement for the engine's worker threads: one code path for CPU and CUDA.

On CUDA each worker runs on its own stream and hands tensors over with events, so the vocoder
overlaps the next decode step without a host synchronisation.

On the CPU all torch work runs on one thread (the generator's; the vocoder runs inline there).
torch's OpenMP runtime keeps a pool of worker threads for every thread that has run a parallel
kernel, for as long as that thread lives. Once the pools hold more threads than there are
cores, idle workers stop spinning and sleep, and every parallel kernel pays to wake them:
measured on the 2-core dev CPU, one decode step took 73 ms alone and 95 ms while a second,
idle thread that had once run torch work was alive. Hence one torch thread on the CPU, and
short jobs (loading) on a thread that ends with them (:func:`run_on_own_thread`) rather than
on a pool thread that outlives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


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
    """The dtype the model computes in. ``auto``: bf16 on CUDA and on CPUs with native bf16
    (AVX512-BF16/AMX), else fp32. ``int8`` (int8 weights) computes in what ``auto`` picks: on a
    CPU without native bf16, bf16 activations would run emulated."""
    named = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    if requested not in ("auto", "int8"):
        if requested not in named:
            raise ValueError(f"dtype must be auto, bf16, fp16, fp32 or int8, got {requested!r}")
        return named[requested]
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if _cpu_has_native_bf16() else torch.float32


def emulation_warning(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why ``dtype`` will run slowly on ``device``: bf16 asked for on a CPU without native bf16,
    which torch emulates; else None."""
    if device.type != "cpu" or dtype != torch.bfloat16 or _cpu_has_native_bf16():
        return None
    return (
        "this CPU has no native bf16 (AVX512-BF16/AMX): torch emulates bf16, so it runs far "
        "slower than fp32 here; dtype auto picks fp32 (and int8 computes in fp32)"
    )


def _cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = cpuinfo.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def fulfil(future: Future[T], fn: Callable[[], T]) -> None:
    """Run ``fn`` into ``future`` (unless it was cancelled first); an error goes there too."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn()
    except BaseException as exc:  # the waiting side gets it
        future.set_exception(exc)
    else:
        future.set_result(result)


async def run_on_own_thread(fn: Callable[[], T], name: str) -> T:
    """Run ``fn`` on a new thread that ends when it returns; await its result.

    Unlike ``asyncio.to_thread``, whose pool threads live on (and with them any OpenMP pool
    they started), the thread is gone once ``fn`` is done.
    """
    future: Future[T] = Future()
    threading.Thread(target=fulfil, args=(future, fn), name=name, daemon=True).start()
    return await asyncio.wrap_future(future)
