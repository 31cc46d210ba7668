"""Which work the generator does in one iteration: the deadline-first policy of
:mod:`streamtts.scheduling` applied to Fish's prefill chunks and batched decode steps. Pure:
no torch, no I/O.

Each iteration prefills at most one chunk of one waiting prompt, then runs one decode step for
a batch of the decoding segments.

- **Prefill**: the waiting prompt with the earliest deadline (a new stream's: its arrival plus
  the TTFA target), if it is due before every decoding stream's deadline, or if the decoding
  streams have slack enough for a chunk before any of them runs out of audio. Otherwise the
  iteration only decodes: a chunk would make a stream about to run out stutter.
- **Decode**: every decoding segment, earliest deadline first, but those of streams already
  ``max_lead_s`` ahead of real time sit out while others need the compute (a prompt waits, or
  another stream is behind).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from streamtts.scheduling import PlaybackClock, SchedulingSettings


class Paced(Protocol):
    @property
    def clock(self) -> PlaybackClock: ...


class Schedulable(Protocol):
    @property
    def stream(self) -> Paced: ...

    @property
    def decoding(self) -> bool: ...

    @property
    def submitted_s(self) -> float: ...


J = TypeVar("J", bound=Schedulable)


class Scheduler:
    def __init__(self, settings: SchedulingSettings) -> None:
        self.settings = settings

    def deadline_s(self, job: Schedulable) -> float:
        return job.stream.clock.deadline_s(job.submitted_s, self.settings)

    def next_prefill(self, jobs: Sequence[J], now_s: float, chunk_s: float) -> J | None:
        """The prompt to prefill a chunk of now (``chunk_s``: what a chunk costs), or None."""
        waiting = [j for j in jobs if not j.decoding]
        if not waiting:
            return None
        due = min(waiting, key=self.deadline_s)
        decoding = [
            self.deadline_s(j)
            for j in jobs
            if j.decoding and not j.stream.clock.far_ahead(now_s, self.settings)
        ]
        earliest = min(decoding, default=float("inf"))
        if self.deadline_s(due) <= earliest or earliest - now_s > chunk_s:
            return due
        return None

    def decode_batch(self, jobs: Sequence[J], now_s: float, prefill_waiting: bool) -> list[J]:
        """The decoding jobs to step now, earliest deadline first, less those far ahead of real
        time when others need compute (``prefill_waiting``: a prompt still waits)."""
        decoding = sorted((j for j in jobs if j.decoding), key=self.deadline_s)
        behind = [j for j in decoding if not j.stream.clock.far_ahead(now_s, self.settings)]
        return behind if behind or prefill_waiting else decoding
