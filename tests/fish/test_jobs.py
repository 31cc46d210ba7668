"""The chunk schedule: a short first chunk, then chunks no longer than the audio already sent,
or sooner when the listener would run dry."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
VOCODER_CALL_S, VOCODER_FRAME_S = 0.009, 0.004  # the CPU's bf16 vocoder (2026-12-02)


@dataclass
class Listening:
    waits: int = 0  # times the listener ran dry
    waited_s: float = 0.0  # for how long in all


def listen(
    schedule: ChunkSchedule, realtime_factor: float, total_frames: int = 200, lead: bool = True
) -> Listening:
    """What a listener hears when frames are made at ``realtime_factor`` of real time (in
    8-frame chunks) on the CPU generator's loop: a decode step per frame, the vocoder inline
    after the iteration (a fixed cost per call and one per frame), and the schedule asked as
    the generator asks it (``lead``: with the listener's lead, else the ramp alone)."""
    decode_s = realtime_factor * FRAME_S - VOCODER_FRAME_S - VOCODER_CALL_S / 8
    now_s, emitted, pending, iteration_s = 0.0, 0, 0, decode_s
    handed_s: float | None = None  # when the first chunk was handed over (the clock's start)
    heard_until_s: float | None = None  # when the listener runs out of what arrived
    heard = Listening()
    for _ in range(total_frames):
        started_s = now_s
        now_s += decode_s
        pending += 1
        lead_s = 0.0 if handed_s is None else max(0.0, handed_s + emitted * FRAME_S - now_s)
        next_chance_s = NEXT_CHANCE_ITERATIONS * iteration_s
        if schedule.due(emitted, pending, lead_s if lead else math.inf, next_chance_s):
            handed_s = now_s if handed_s is None else handed_s
            now_s += VOCODER_CALL_S + VOCODER_FRAME_S * pending
            if heard_until_s is not None and now_s > heard_until_s + 1e-9:
                heard.waits += 1
                heard.waited_s += now_s - heard_until_s
            heard_until_s = max(heard_until_s or now_s, now_s) + pending * FRAME_S
            emitted, pending = emitted + pending, 0
        iteration_s = now_s - started_s
    return heard


@pytest.mark.parametrize("first", [1, 2, 4])
@pytest.mark.parametrize("realtime_factor", [0.3, 0.6, 0.7, 0.79])
def test_a_stream_made_well_faster_than_real_time_never_waits(
    first: int, realtime_factor: float
) -> None:
    assert listen(ChunkSchedule(first, 8), realtime_factor).waits == 0


@pytest.mark.parametrize("realtime_factor", [0.3, 0.6, 0.79, 0.8, 0.85, 0.9])
def test_the_automatic_first_chunk_never_leaves_the_listener_waiting(
    realtime_factor: float,
) -> None:
    first = ChunkSchedule.auto_first_frames(realtime_factor)
    assert first == (2 if realtime_factor >= 0.8 else 1)
    assert listen(ChunkSchedule(first, 8), realtime_factor).waits == 0


def test_a_one_frame_start_near_real_time_leaves_too_little_lead() -> None:
    """Why 2 frames from 0.8x: growing past the vocoder's fixed cost needs more lead than one."""
    assert listen(ChunkSchedule(1, 8), 0.85).waits > 0


def test_the_ramp_alone_starves_a_stream_made_under_real_time() -> None:
    """Why the lead counts: at 0.7x real time the ramp's 8-frame chunk comes too late."""
    assert listen(ChunkSchedule(1, 8), 0.7, lead=False).waits > 0
    assert listen(ChunkSchedule(1, 8), 0.5, lead=False).waits == 0


@pytest.mark.parametrize("realtime_factor", [0.95, 1.05, 1.5])
def test_past_real_time_early_chunks_cost_no_more_waiting_than_the_ramp(
    realtime_factor: float,
) -> None:
    """Near or past real time, early chunks stop once the listener has run dry, so the
    vocoder's fixed cost per call does not keep the stream behind."""
    schedule = ChunkSchedule(ChunkSchedule.auto_first_frames(realtime_factor), 8)
    with_lead = listen(schedule, realtime_factor)
    ramp = listen(schedule, realtime_factor, lead=False)
    assert with_lead.waited_s <= 1.2 * ramp.waited_s + 0.05


def test_a_chunk_goes_early_only_while_the_listener_still_has_audio() -> None:
    schedule = ChunkSchedule(2, 8)
    assert not schedule.due(0, 1, lead_s=0.05, next_chance_s=1.0)  # first audio: the first chunk
    assert not schedule.due(2, 1, lead_s=0.05, next_chance_s=1.0)  # shorter than the first
    assert schedule.due(4, 2, lead_s=0.05, next_chance_s=0.1)
    assert not schedule.due(4, 2, lead_s=0.2, next_chance_s=0.1)  # enough audio: wait for 4
    assert not schedule.due(4, 2, lead_s=0.0, next_chance_s=0.1)  # ran dry: wait for 4
    fixed = ChunkSchedule(2, 8, early=False)  # a seeded stream's: timing changes nothing
    assert not fixed.due(4, 2, lead_s=0.05, next_chance_s=0.1)


def test_the_first_chunk_is_one_frame_unless_near_real_time() -> None:
    assert ChunkSchedule.auto_first_frames(None) == 1  # nothing measured yet
    assert ChunkSchedule.auto_first_frames(0.5) == 1
    assert ChunkSchedule.auto_first_frames(0.8) == 2
    assert ChunkSchedule.auto_first_frames(0.99) == 2
    assert ChunkSchedule.auto_first_frames(1.6) == 1  # behind anyway: first audio sooner
