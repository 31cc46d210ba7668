"""Handing results from worker threads to a coroutine waiting on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


def threadsafe_put(
    loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[object]
) -> Callable[[object], None]:
    """A callable any thread may use to put an item into ``queue`` on ``loop``."""

    def post(item: object) -> None:
        # RuntimeError: the loop closed while we worked, so nobody is listening.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, item)

    return post
