"""The chunk schedule: a short first chunk, then chunks no longer than the audio already sent."""

from __future__ import annotations

import pytest

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
