"""What every engine worker thread shares: a thread (or none, inline), an inbox of commands, a
stop, a fatal error, and retrying a failed batch one item at a time.

A worker owns a share of the model work. Callers post commands from any thread; the worker's
loop takes them with :meth:`Worker.take` and returns when that says to stop. An exception that
escapes the loop is fatal: it is logged, reported through ``on_fatal`` (the engine stops being
healthy) and the thread ends. A failure of one item of work is not: :func:`each_alone` finds
the item that fails and fails only it.
"""

from __future__ import annotations

import abc
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

C = TypeVar("C")
T = TypeVar("T")

OnFatal = Callable[[BaseException], None]


class _Stop:
    pass


_STOP = _Stop()


class Worker(abc.ABC, Generic[C]):
    """A worker thread with an inbox of commands of type ``C``.

    ``inline``: no thread of its own; whoever owns the worker calls its work directly (the Fish
    vocoder on a CPU runs on the generator's thread) and ``start``/``stop`` only mark it.
    """

    def __init__(self, name: str, on_fatal: OnFatal, *, inline: bool = False) -> None:
        self.name = name
        self.inline = inline
        self._on_fatal = on_fatal
        self._inbox: queue.SimpleQueue[C | _Stop] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._stopped = False

    # ---- any thread ----

    def start(self) -> None:
        if not self.inline:
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the loop to stop after the commands already posted; wait for the thread."""
        self._stopped = True
        if not self.inline and self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout=timeout_s)

    def is_alive(self) -> bool:
        return not self._stopped if self.inline else self._thread.is_alive()

    def post(self, command: C) -> None:
        self._inbox.put(command)

    # ---- the worker's thread ----

    def take(self, block: bool) -> list[C] | None:
        """The commands waiting now (with ``block``, wait for at least one); ``None`` once a
        stop was posted (the commands before it are returned first)."""
        commands: list[C] = []
        while True:
            try:
                command = self._inbox.get(block=block and not commands)
            except queue.Empty:
                return commands
            if isinstance(command, _Stop):
                if commands:
                    self._inbox.put(_STOP)  # stop after these
                    return commands
                return None
            commands.append(command)

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # the worker is dead: say so loudly, fail what it held
            log.exception("%s thread died", self.name)
            self.fail_all(exc)
            self._on_fatal(exc)

    @abc.abstractmethod
    def run(self) -> None:
        """The loop; returns when :meth:`take` returns ``None``."""

    def fail_all(self, exc: BaseException) -> None:
        """The thread is dying with ``exc``: fail every piece of work it holds."""


def each_alone(
    items: Sequence[T],
    run: Callable[[Sequence[T]], None],
    fail: Callable[[T, Exception], None],
) -> None:
    """``run(items)``; if that raises, ``run([item])`` for each item, and ``fail(item, error)``
    for each that still raises. ``run`` must leave the state of an item unchanged when it
    raises (both workers advance their state only after a successful batch), so the items
    that did not fail are retried and served."""
    try:
        run(items)
        return
    except Exception as exc:
        if len(items) == 1:
            log.exception("%s failed", type(items[0]).__name__)
            fail(items[0], exc)
            return
        log.warning("a batch of %d failed; retrying each alone", len(items), exc_info=True)
    for item in items:
        try:
            run([item])
        except Exception as exc:
            log.exception("%s failed", type(item).__name__)
            fail(item, exc)
