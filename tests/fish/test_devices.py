"""Device helpers: a job on a thread of its own that ends with it."""

from __future__ import annotations

import threading

import pytest

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
