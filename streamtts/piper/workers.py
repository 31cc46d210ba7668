"""Piper's worker threads, taking jobs earliest deadline first (see streamtts.scheduling).

A job is one piece of a segment (:func:`job_pieces`): long segments are cut at clause
boundaries so one job never holds a worker for long, and a stream about to run out of audio
never waits behind seconds of another stream's sentence.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)

_CLAUSE_END = re.compile(r"[,;:\u2013\u2014\u3001\uff0c\uff1b\uff1a](?=\s)|[.!?\u2026]+(?=\s)")


def job_pieces(text: str, max_chars: int) -> list[str]:
    """``text`` cut into pieces: at the last clause or sentence boundary within the limit, else
    the last space, else at the limit. The first piece is at most half of ``max_chars``; each
    later one at most as long as the pieces before it together (but never held below the first
    piece's limit, so a short first clause is not followed by word-sized pieces), up to
    ``max_chars`` (50, 50, 100, 100, … for 100). A segment's first audio is what its listener
    waits for (the listener of a new stream, or one about to hear the end of the previous
    segment), Piper makes none of a piece's audio before all of it, and while the first piece
    plays the next must be made — for every stream that started at the same moment: so the
    next is no longer than it."""
    pieces: list[str] = []
    rest = text.strip()
    first_limit = max(1, max_chars // 2)
    limit, made = first_limit, 0
    while len(rest) > limit:
        window = rest[: limit + 1]
        cuts = [m.end() for m in _CLAUSE_END.finditer(window) if m.end() <= limit]
        cut = cuts[-1] if cuts else window.rfind(" ")
        if cut <= 0:
            cut = limit
        pieces.append(rest[:cut].strip())
        made += len(pieces[-1])
        rest = rest[cut:].strip()
        limit = min(max_chars, max(first_limit, made))
    if rest:
        pieces.append(rest)
    return [p for p in pieces if p]


class DeadlineWorkers:
    """``threads`` threads running submitted calls, earliest ``deadline_s`` first (ties in
    arrival order)."""

    def __init__(self, threads: int, name: str) -> None:
        self._heap: list[tuple[float, int, Callable[[], Any], Future[Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._main, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, deadline_s: float, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._ready:
            if self._stopped:
                raise RuntimeError("the workers are stopped")
            heapq.heappush(self._heap, (deadline_s, next(self._order), fn, future))
            self._ready.notify()
        return future

    @property
    def queued(self) -> int:
        with self._ready:
            return len(self._heap)

    def shutdown(self) -> None:
        """Cancel what is queued and let the threads end after their current call."""
        with self._ready:
            self._stopped = True
            for *_, future in self._heap:
                future.cancel()
            self._heap.clear()
            self._ready.notify_all()

    def _main(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._stopped:
                    self._ready.wait()
                if self._stopped:
                    return
                *_, fn, future = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # the submitter gets it
                future.set_exception(exc)
