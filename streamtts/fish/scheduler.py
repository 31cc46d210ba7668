"""Which work the generator does in one iteration: pure policy, no torch, no I/O.

Each iteration prefills at most one chunk of one waiting prompt, then runs one decode step for
a batch of the decoding segments. Today's policy: prompts in arrival order; every decoding
segment in the batch, except that a stream whose audio already runs ``max_lead_s`` ahead of
real time sits out while others need compute (a prompt waits, or another stream is behind).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Pacing(Protocol):
    def audio_lead_s(self, now_s: float) -> float: ...


class Schedulable(Protocol):
    @property
    def stream(self) -> Pacing: ...

    @property
    def decoding(self) -> bool: ...


J = TypeVar("J", bound=Schedulable)


class Scheduler:
    def __init__(self, max_lead_s: float) -> None:
        self.max_lead_s = max_lead_s

    def next_prefill(self, jobs: Sequence[J]) -> J | None:
        """The prompt to prefill a chunk of now (``jobs`` in arrival order)."""
        return next((j for j in jobs if not j.decoding), None)

    def decode_batch(self, jobs: Sequence[J], now_s: float, prefill_waiting: bool) -> list[J]:
        """The decoding jobs to step now, less those far ahead of real time when others need
        compute (``prefill_waiting``: a prompt is still being prefilled)."""
        decoding = [j for j in jobs if j.decoding]
        behind = [j for j in decoding if j.stream.audio_lead_s(now_s) < self.max_lead_s]
        return behind if behind or prefill_waiting else decoding
