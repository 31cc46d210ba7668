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
        (False, torch.bfloat16, "cpu", True),  # bf16 (explicit, or int8's activations) emulated
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
