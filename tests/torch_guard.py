"""A guard that fails on any torch operation run on the current thread (the event loop's)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class TorchOnThisThread(AssertionError):
    pass


class _Forbid(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise TorchOnThisThread(f"torch ran {func} on the event loop's thread")


@contextmanager
def no_torch_on_this_thread() -> Iterator[None]:
    """Every torch operator dispatched on this thread inside raises (tensor factories, views,
    arithmetic). Dispatch modes are per thread: the engine's worker threads run as usual."""
    with _Forbid():
        yield
