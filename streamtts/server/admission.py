"""Admission control: how many contexts (WebSocket) and speech requests (HTTP) may be in flight
at once, server-wide (``max_active_contexts``).

A request for work takes a :class:`Ticket` or is refused at once — never queued — so refusals
are answered in microseconds and admitted streams keep their real-time pace. The engine may
still refuse an admitted stream (no KV slot: ``OverloadedError``); callers map that to the same
outcome as a refusal here.
"""

from __future__ import annotations

# Seconds a refused HTTP client is told to wait (``Retry-After``).
RETRY_AFTER_S = 1


class Ticket:
    """One admitted unit of work. :meth:`release` is idempotent."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission._release()
            self._admission = None


class Admission:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the admission limit must be >= 1")
        self.limit = limit
        self.active = 0
        self.refused = 0

    @property
    def full(self) -> bool:
        return self.active >= self.limit

    def try_acquire(self) -> Ticket | None:
        """A ticket, or None when ``limit`` tickets are out."""
        if self.full:
            self.refused += 1
            return None
        self.active += 1
        return Ticket(self)

    def _release(self) -> None:
        self.active -= 1
        assert self.active >= 0, "admission ticket released twice"
