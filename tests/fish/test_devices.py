"""Device helpers: a job on a thread of its own that ends with it; a dtype this CPU emulates."""

from __future__ import annotations

import threading

import pytest
import torch

from streamtts.fish import devices
from streamtts.fish.devices import run_on_own_thread


async def test_run_on_own_thread_returns_and_the_thread_ends() -> None:
    seen: list[threading.Thread] = []

    def job() -> int:
        seen.append(threading.current_thread())
        return 42

    assert await run_on_own_thread(job, "one-off") == 42
    assert seen[0] is not threading.main_thread() and seen[0].name == "one-off"
    seen[0].join(timeout=5)
    assert not seen[0].is_alive()


async def test_run_on_own_thread_raises_the_jobs_error() -> None:
    def job() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        await run_on_own_thread(job, "failing")


@pytest.mark.parametrize(
    ("native", "dtype", "device", "warns"),
    [
        (False, torch.bfloat16, "cpu", True),  # bf16 asked for, emulated
        (True, torch.bfloat16, "cpu", False),
        (False, torch.float32, "cpu", False),
        (False, torch.bfloat16, "cuda", False),
    ],
)
def test_a_dtype_this_cpu_emulates_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, native: bool, dtype: torch.dtype, device: str, warns: bool
) -> None:
    monkeypatch.setattr(devices, "_cpu_has_native_bf16", lambda: native)
    warning = devices.emulation_warning(dtype, torch.device(device))
    assert (warning is not None) == warns
    if warning is not None:
        assert "emulates bf16" in warning and "auto picks fp32" in warning


@pytest.mark.parametrize(
    ("native", "device", "computes_in"),
    [
        (True, "cpu", torch.bfloat16),
        (False, "cpu", torch.float32),  # bf16 activations would run emulated here
        (False, "cuda", torch.bfloat16),
    ],
)
def test_int8_computes_in_the_dtype_auto_picks(
    monkeypatch: pytest.MonkeyPatch, native: bool, device: str, computes_in: torch.dtype
) -> None:
    monkeypatch.setattr(devices, "_cpu_has_native_bf16", lambda: native)
    for requested in ("auto", "int8"):
        assert devices.choose_dtype(requested, torch.device(device)) == computes_in
    assert devices.choose_dtype("bf16", torch.device(device)) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be"):
        devices.choose_dtype("int4", torch.device(device))
