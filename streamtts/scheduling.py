"""Deadline-first scheduling and capacity, for every engine: pure policy, no I/O, no torch.

A stream's **deadline** is the moment its listener runs out of audio: the time its first audio
was made plus the seconds of audio made since (:class:`PlaybackClock`), on the server's clock.
Work is ordered by deadline, earliest first. A stream that is silent (it has no audio yet, or its
listener has heard everything and waits for the next sentence) has no playback to keep up: its
next piece of work is ranked by the time-to-first-audio target instead (``ttfa_target_s``
after the work arrived). Streams far ahead of real time (``max_lead_s``) sit out while others
need the compute.

**Capacity** is learned online (:class:`CostModel`): the engine reports how long its work took
for how much audio (by batch size where batching changes the cost), and the model estimates
how many streams it can keep at real time. Admission (``streamtts.server.admission``) refuses
a new stream once admitting it would exceed that, instead of letting every stream stutter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from streamtts.bounds import SettingsError, require_bounds


@dataclass(frozen=True)
class SchedulingSettings:
    ttfa_target_s: float = 0.25  # a silent stream's work is due this long after it arrives
    max_lead_s: float = 6.0  # a stream this far ahead of real time yields to others
    # Admit new streams by the engine's learned real-time capacity (else by the limits alone).
    admit_by_capacity: bool = True
    # Of the learned capacity, the share kept spare: admission stops at (1 - headroom) of it.
    # Learned mostly in the steady state (the start's figure on an idle machine); streams that
    # start together need more at first (their first two pieces within the first's playback):
    # 0.2 and 0.3 left some of them underrunning (docs/operations.md, "Scheduling and capacity").
    capacity_headroom: float = 0.4
    # Each context's audio goes to its socket at most this far ahead of its playback clock;
    # the rest waits in the server, where a cancel drops it.
    max_send_ahead_ms: float = 1500.0

    def __post_init__(self) -> None:
        require_bounds(self, ttfa_target_s=0.01, max_send_ahead_ms=100)
        if not 0 <= self.capacity_headroom < 1:
            raise SettingsError("capacity_headroom must be in [0, 1)")


@dataclass
class PlaybackClock:
    """One stream's playback, as the server makes its audio (the listener starts hearing at the
    first audio and hears it at real time from then on)."""

    first_audio_s: float | None = None
    audio_s: float = 0.0

    def produced(self, seconds: float, now_s: float) -> None:
        """``seconds`` of audio were made at ``now_s``."""
        if seconds <= 0:
            return
        if self.first_audio_s is None:
            self.first_audio_s = now_s
        self.audio_s += seconds

    @property
    def runs_out_s(self) -> float | None:
        """When the listener runs out of audio (None before the first audio)."""
        return None if self.first_audio_s is None else self.first_audio_s + self.audio_s

    def resumed(self, now_s: float) -> None:
        """The listener ran out of audio and starts hearing again at ``now_s`` (a client plays
        late audio as it arrives)."""
        if self.first_audio_s is not None:
            self.first_audio_s = now_s - self.audio_s

    def lead_s(self, now_s: float) -> float:
        """Audio made beyond what has been heard by ``now_s`` (0 before the first audio)."""
        runs_out = self.runs_out_s
        return 0.0 if runs_out is None else max(0.0, runs_out - now_s)

    def deadline_s(self, arrived_s: float, settings: SchedulingSettings) -> float:
        """When work for this stream that arrived at ``arrived_s`` is due."""
        runs_out = self.runs_out_s
        if runs_out is not None and runs_out > arrived_s:
            return runs_out  # still playing: continue before the listener runs out
        return arrived_s + settings.ttfa_target_s  # silent: as fast as a first audio

    def far_ahead(self, now_s: float, settings: SchedulingSettings) -> bool:
        return self.lead_s(now_s) >= settings.max_lead_s


@dataclass
class RunningMean:
    """An exponentially weighted mean that forgets old measurements (the machine changes)."""

    value: float | None = None
    samples: int = 0

    def observe(self, x: float, weight: float) -> None:
        self.value = x if self.value is None else (1 - weight) * self.value + weight * x
        self.samples += 1


@dataclass
class CostModel:
    """Compute seconds per audio second, by batch size (1 for engines that do not batch), with
    ``parallel`` workers sharing the load (Piper's threads; 1 for a batching engine)."""

    parallel: int = 1
    weight: float = 0.2  # of the newest measurement in the running mean
    _by_batch: dict[int, RunningMean] = field(default_factory=dict)

    def observe(self, compute_s: float, audio_s: float, batch: int = 1) -> None:
        """``batch`` streams made ``audio_s`` seconds of audio each in ``compute_s``."""
        if audio_s <= 0 or compute_s < 0:
            return
        self._by_batch.setdefault(batch, RunningMean()).observe(compute_s / audio_s, self.weight)

    def cost(self, batch: int) -> float | None:
        """Estimated compute seconds per audio second of one step at ``batch``: measured, or
        interpolated between measured sizes, or extrapolated linearly from the largest."""
        known = sorted((b, r.value) for b, r in self._by_batch.items() if r.value is not None)
        if not known:
            return None
        for b, value in known:
            if b == batch:
                return value
        below = [(b, v) for b, v in known if b < batch]
        above = [(b, v) for b, v in known if b > batch]
        if below and above:
            (b0, v0), (b1, v1) = below[-1], above[0]
            return v0 + (v1 - v0) * (batch - b0) / (b1 - b0)
        if above:
            return above[0][1]  # a smaller batch costs at most as much as a larger one
        b0, v0 = below[-1]
        return v0 * batch / b0  # beyond what was seen: as if batching gave nothing more

    def realtime_streams(self, limit: int, headroom: float) -> float | None:
        """How many streams can run at real time at once (at most ``limit``), keeping
        ``headroom`` (0..1) of the compute spare; None before any measurement.

        A batching engine (``parallel`` 1) keeps ``b`` streams at real time while one step of
        ``b`` makes its audio faster than it plays; workers that run one stream at a time share
        their audio seconds per second among the streams."""
        if self.parallel > 1:
            single = self.cost(1)
            if single is None:
                return None
            return min(float(limit), self.parallel * (1 - headroom) / max(single, 1e-9))
        best = 0.0
        for batch in range(1, limit + 1):
            cost = self.cost(batch)
            if cost is None:
                return None
            if cost <= 1 - headroom:
                best = float(batch)
        return best

    def measured_batches(self) -> Iterable[int]:
        return sorted(self._by_batch)


# Before a piece's rest, each other open stream has about one piece of its own to be made, not
# two: one that started earlier has had its first window made and its rest is due before this
# one's; one that starts later has its first window due first and its rest after this one's.
# Each is counted as this share of this piece's compute. Whole pieces (1) made the rests of 16
# streams starting together 245-330 ms before their listeners ran out, and first audio waited
# for the windows that bought that; half (an even split) left streams running dry at 18 and 64
# clients; 0.7 none in 18 load-test levels (docs/operations.md, "First windows under a burst").
OTHER_PIECE_SHARE = 0.7
# A rest that a worker takes up with less than its estimated compute plus this left before its
# listener runs out goes out as a window first (:func:`rest_is_late`): the margin is for what
# the estimate does not see (the machine slowing down for a while, the event loop's and the
# sockets' share of the cores). With 0.08 s, 3 of 10 load-test levels of 16 clients had a
# stream run dry in a slower stretch; with 0.15 s, none of 11 (a share of 0.5 both times).
LATE_MARGIN_S = 0.15


def first_window_s(*, lead_s: float, make_s: float, others: int, workers: int) -> float:
    """Seconds of audio a piece's first window must hold, made before the rest of the piece,
    so that its listener does not run out while the rest is made: 0 where the listener's
    ``lead_s`` (audio not yet heard) already covers that (a window as long as the piece
    means the same: make it whole).

    ``make_s``: the estimated compute of all of the piece. The rest may also wait behind a
    piece of each of the ``others`` open streams (:data:`OTHER_PIECE_SHARE` of ``make_s``
    each), shared by ``workers``: a window shrinks the listener's buffer, and streams that
    start together would otherwise run dry at once. Where the estimate falls short, the rest
    is cut again when a worker takes it up (:func:`rest_is_late`)."""
    waiting_s = max(0, others) * OTHER_PIECE_SHARE * make_s / max(1, workers)
    return max(0.0, waiting_s + make_s - lead_s)


def rest_is_late(*, time_left_s: float, make_s: float) -> bool:
    """Whether the rest of a piece, taken up ``time_left_s`` before its listener runs out of
    audio (negative: already out) and estimated at ``make_s`` of compute, would reach the
    listener too late if made whole: then a window of it goes first and the remainder is
    queued by its own, later, deadline."""
    return make_s + LATE_MARGIN_S > time_left_s


def earliest(deadlines: Iterable[float]) -> float:
    return min(deadlines, default=math.inf)
