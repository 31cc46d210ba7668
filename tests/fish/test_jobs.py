"""The chunk schedule: a short first chunk, then chunks no longer than the audio already sent,
or sooner when the listener would run dry."""

from __future__ import annotations

import pytest

from streamtts.fish.generator import NEXT_CHANCE_ITERATIONS
from streamtts.fish.jobs import ChunkSchedule


def chunk_sizes(schedule: ChunkSchedule, total_frames: int) -> list[int]:
    """The chunks a segment of ``total_frames`` is handed over in, frame by frame."""
    sizes, emitted, pending = [], 0, 0
    for _ in range(total_frames):
        pending += 1
        if schedule.due(emitted, pending):
            sizes.append(pending)
            emitted, pending = emitted + pending, 0
    return sizes


@pytest.mark.parametrize(
    ("first", "later", "expected"),
    [
        (2, 8, [2, 2, 4, 8, 8, 8]),
        (4, 8, [4, 4, 8, 8, 8]),
        (1, 4, [1, 1, 2, 4, 4, 4, 4, 4, 4, 4]),
        (16, 8, [16, 8, 8]),  # a first chunk longer than the rest: the rest stay at 8
        (3, 64, [3, 3, 6, 12]),  # the last 8 of 32 frames wait for the segment's end
    ],
)
def test_later_chunks_ramp_up_to_chunk_frames(first: int, later: int, expected: list[int]) -> None:
    assert chunk_sizes(ChunkSchedule(first, later), 32) == expected


def test_no_chunk_is_longer_than_the_audio_already_sent() -> None:
    for first in range(1, 9):
        sizes = chunk_sizes(ChunkSchedule(first, 8), 200)
        for i, size in enumerate(sizes[1:], start=1):
            assert size <= max(first, sum(sizes[:i]))


FRAME_S = 0.0464  # audio per frame


def underruns(
    schedule: ChunkSchedule, realtime_factor: float, total_frames: int = 120, lead: bool = True
) -> int:
    """Times a listener waits for audio when each frame takes ``realtime_factor`` of its length
    to make and the vocoder runs inline (a tenth of that per frame, after each iteration) — the
    CPU generator's loop, with the schedule asked as it asks it."""
    decode_s = 0.9 * realtime_factor * FRAME_S
    vocode_s = 0.1 * realtime_factor * FRAME_S
    now_s, emitted, pending, iteration_s = 0.0, 0, 0, decode_s
    handed_s: float | None = None  # when the first chunk was handed over (the clock's start)
    heard_until_s: float | None = None  # when the listener runs out of what arrived
    waits = 0
    for _ in range(total_frames):
        started_s = now_s
        now_s += decode_s
        pending += 1
        lead_s = 0.0 if handed_s is None else max(0.0, handed_s + emitted * FRAME_S - now_s)
        if schedule.due(
            emitted,
            pending,
            lead_s if lead else float("inf"),
            NEXT_CHANCE_ITERATIONS * iteration_s,
        ):
            handed_s = now_s if handed_s is None else handed_s
            now_s += vocode_s * pending  # inline, after the iteration
            if heard_until_s is not None and now_s > heard_until_s + 1e-9:
                waits += 1
            heard_until_s = max(heard_until_s or now_s, now_s) + pending * FRAME_S
            emitted, pending = emitted + pending, 0
        iteration_s = now_s - started_s
    return waits


@pytest.mark.parametrize("first", [1, 2, 4])
@pytest.mark.parametrize("realtime_factor", [0.3, 0.6, 0.8, 0.95])
def test_a_stream_made_faster_than_real_time_never_waits(
    first: int, realtime_factor: float
) -> None:
    assert underruns(ChunkSchedule(first, 8), realtime_factor) == 0


def test_the_ramp_alone_starves_a_stream_made_just_under_real_time() -> None:
    """Why the lead counts: at 0.8x real time the ramp's 8-frame chunk comes too late."""
    assert underruns(ChunkSchedule(2, 8), 0.8, lead=False) > 0
    assert underruns(ChunkSchedule(2, 8), 0.5, lead=False) == 0


def test_a_chunk_goes_early_only_once_audio_has_started_and_a_frame_is_pending() -> None:
    schedule = ChunkSchedule(2, 8)
    assert not schedule.due(0, 1, lead_s=0.0, next_chance_s=1.0)  # first audio: the first chunk
    assert not schedule.due(2, 0, lead_s=0.0, next_chance_s=1.0)
    assert schedule.due(2, 1, lead_s=0.05, next_chance_s=0.1)
    assert not schedule.due(2, 1, lead_s=0.2, next_chance_s=0.1)  # enough audio: wait for 2
