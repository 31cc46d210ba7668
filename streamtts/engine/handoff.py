"""Handing results from worker threads to the coroutine that streams them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np

from streamtts.engine.base import PcmF32, StreamStats, SynthesisError

_END = object()


class PcmHandoff:
    """PCM chunks, the end of a segment, or an error, posted by any thread and consumed by one
    coroutine on the loop that created it."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._stopped = False

    def post(self, item: PcmF32 | BaseException) -> None:
        self._put(item)

    def end(self) -> None:
        self._put(_END)

    def stop(self) -> None:
        """The consumer cancelled: :meth:`chunks` returns at once, dropping what is queued
        (audio posted before the cancel is never yielded after it)."""
        self._stopped = True
        self.end()  # wakes the waiting consumer

    def _put(self, item: object) -> None:
        # RuntimeError: the loop closed while a worker was busy, so nobody is listening.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def chunks(self, stats: StreamStats, engine: str) -> AsyncIterator[PcmF32]:
        """Yield posted PCM until :meth:`end`; a posted exception raises :class:`SynthesisError`."""
        while True:
            item = await self._queue.get()
            if item is _END or self._stopped:
                return
            if isinstance(item, BaseException):
                raise SynthesisError(f"{engine} synthesis failed: {item}") from item
            assert isinstance(item, np.ndarray)
            stats.audio_samples += item.size
            yield item
