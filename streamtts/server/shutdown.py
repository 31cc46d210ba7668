"""Graceful shutdown and the engine watchdog.

Order on SIGTERM (or SIGINT):

1. readiness goes false at once; new WebSockets are closed with 1001 and new speech requests get
   503 — the listener stays open meanwhile so probes see the 503;
2. in-flight contexts and speech requests get ``shutdown_grace_s`` to finish;
3. what is left ends: contexts with ``done`` reason ``shutdown``, sockets close with 1001,
   speech bodies stop;
4. uvicorn closes the listener, the lifespan stops the engine, the process exits 0.

A second signal skips the wait. If the engine's worker threads die, the watchdog takes the same
path with no grace and the process exits 1 instead of hanging half-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Protocol

import uvicorn

from streamtts.engine.base import Engine
from streamtts.server.admission import Admission

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05
EXIT_OK = 0
EXIT_ENGINE_FAILED = 1


class Drainable(Protocol):
    async def shutdown(self) -> None:
        """End every context with ``done`` reason ``shutdown`` and close the socket (1001)."""


class Lifecycle:
    """Readiness, draining and the exit code, shared by the app and the server runner."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.ready = False
        self.draining = False
        self.exit_code = EXIT_OK
        # Set once the grace period is over: in-flight work must stop now.
        self.expired = asyncio.Event()
        self.drained = asyncio.Event()
        self._sockets: set[Drainable] = set()
        self._drain_task: asyncio.Task[None] | None = None
        # Replaced by the runner (``GracefulServer``) so a fatal error can end the process.
        self.request_exit: Callable[[], None] = _signal_self

    def register(self, socket: Drainable) -> None:
        self._sockets.add(socket)

    def unregister(self, socket: Drainable) -> None:
        self._sockets.discard(socket)

    @property
    def open_sockets(self) -> int:
        return len(self._sockets)

    def begin_drain(self, grace_s: float) -> asyncio.Task[None]:
        """Start draining (idempotent); a second call with less grace shortens the wait."""
        self.ready = False
        self.draining = True
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain(grace_s), name="drain")
        elif grace_s <= 0:
            self.expired.set()
        return self._drain_task

    async def _drain(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        log.info(
            "draining: %d contexts in flight, up to %.1f s to finish",
            self.admission.active,
            grace_s,
        )
        while (
            self.admission.active > 0 and time.monotonic() < deadline and not self.expired.is_set()
        ):
            await asyncio.sleep(DRAIN_POLL_S)
        self.expired.set()
        if self.admission.active:
            log.info("grace period over: ending %d contexts", self.admission.active)
        await asyncio.gather(*(s.shutdown() for s in list(self._sockets)), return_exceptions=True)
        self.drained.set()

    def fail(self, reason: str) -> None:
        """The engine is broken: not ready, end everything now, exit non-zero."""
        if self.exit_code == EXIT_OK:
            log.critical("fatal: %s; shutting down", reason)
        self.exit_code = EXIT_ENGINE_FAILED
        self.ready = False
        self.request_exit()


def _signal_self() -> None:
    """Without :class:`GracefulServer` (e.g. another ASGI server), ask the process to stop."""
    signal.raise_signal(signal.SIGTERM)


async def watchdog(engine: Engine, lifecycle: Lifecycle, interval_s: float) -> None:
    """Poll ``engine.healthy()``; on the first False, fail the process."""
    while True:
        await asyncio.sleep(interval_s)
        if not engine.healthy():
            lifecycle.fail("an engine worker thread died")
            return


class GracefulServer(uvicorn.Server):
    """uvicorn, with our shutdown order in front of its own (which would cut sockets with 1012
    at once, and re-raise SIGTERM so the process would die by the signal instead of exiting 0).
    """

    def __init__(
        self, config: uvicorn.Config, lifecycle: Callable[[], Lifecycle | None], grace_s: float
    ) -> None:
        super().__init__(config)
        self._lifecycle = lifecycle
        self._grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        lifecycle = self._lifecycle()
        if lifecycle is not None:
            lifecycle.request_exit = lambda: self._begin(0.0)
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs as a signal handler between bytecodes of the loop thread: only schedule.
        if self._loop is None:
            self.should_exit = True
            return
        grace_s = 0.0 if self._stopping else self._grace_s
        self._loop.call_soon_threadsafe(self._begin, grace_s)

    def _begin(self, grace_s: float) -> None:
        lifecycle = self._lifecycle()
        if lifecycle is None or not self.started:
            self.should_exit = True
            return
        first = not self._stopping
        self._stopping = True
        task = lifecycle.begin_drain(grace_s)
        if first:
            log.info("shutdown requested: draining for up to %.1f s", grace_s)
            self._watch(task)

    def _watch(self, task: asyncio.Task[None]) -> None:
        async def exit_when_drained() -> None:
            with contextlib.suppress(Exception):
                await task
            self.should_exit = True

        self._exit_task: asyncio.Task[None] = asyncio.create_task(exit_when_drained())
