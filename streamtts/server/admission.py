"""Admission control: how many contexts (WebSocket) and speech requests (HTTP) may be in flight
at once, server-wide — by the engine's learned capacity, and by ``max_active_contexts``.

A request for work takes a :class:`Ticket` or is refused at once — never queued — so refusals
are answered in microseconds and admitted streams keep their real-time pace. A new stream is
refused once admitting it would exceed the number of streams the engine can keep at real time
(``Capacity.realtime_streams``, learned from its own measured cost, less the configured
headroom; see streamtts.scheduling), or the hard cap ``max_active_contexts``. One stream is
always admitted on an idle server, even where the engine is slower than real time (its ticket
says so). The engine may still refuse an admitted stream (no KV slot: ``OverloadedError``);
callers map that to the same outcome as a refusal here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# Seconds a refused HTTP client is told to wait (``Retry-After``).
RETRY_AFTER_S = 1


class Ticket:
    """One admitted unit of work. :meth:`release` is idempotent. ``beyond_capacity``: admitted
    alone on an idle server whose engine is slower than real time."""

    def __init__(self, admission: Admission, beyond_capacity: bool = False) -> None:
        self._admission: Admission | None = admission
        self.beyond_capacity = beyond_capacity

    def release(self) -> None:
        if self._admission is not None:
            self._admission._release()
            self._admission = None


class Admission:
    def __init__(self, limit: int, realtime_streams: Callable[[], float | None] = lambda: None):
        if limit < 1:
            raise ValueError("the admission limit must be >= 1")
        self.limit = limit
        self._realtime_streams = realtime_streams
        self.active = 0
        self.refused = 0

    @property
    def realtime_streams(self) -> float | None:
        """The engine's learned real-time capacity (None: by the limit alone, or not known)."""
        return self._realtime_streams()

    @property
    def capacity(self) -> int:
        """How many may be active at once now: the engine's real-time capacity (whole
        streams), at least 1, at most ``limit``."""
        streams = self._realtime_streams()
        if streams is None:
            return self.limit
        return max(1, min(self.limit, math.floor(streams)))

    @property
    def full(self) -> bool:
        return self.active >= self.capacity

    def try_acquire(self) -> Ticket | None:
        """A ticket, or None when the server is at its capacity or its limit."""
        if self.full:
            self.refused += 1
            return None
        self.active += 1
        streams = self._realtime_streams()
        return Ticket(self, beyond_capacity=streams is not None and streams < 1)

    def _release(self) -> None:
        self.active -= 1
        assert self.active >= 0, "admission ticket released twice"
