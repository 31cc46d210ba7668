"""The generator's per-iteration choice on a fake clock: prompts and decode steps by deadline."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamtts.fish.scheduler import Scheduler
from streamtts.scheduling import PlaybackClock, SchedulingSettings

SETTINGS = SchedulingSettings(ttfa_target_s=0.25, max_lead_s=6.0)


@dataclass
class Stream:
    clock: PlaybackClock = field(default_factory=PlaybackClock)


@dataclass
class Job:
    name: str
    decoding: bool
    submitted_s: float = 0.0
    stream: Stream = field(default_factory=Stream)


def playing(name: str, runs_out_s: float, now_s: float = 0.0) -> Job:
    """A decoding job whose listener runs out at ``runs_out_s``."""
    job = Job(name, decoding=True)
    job.stream.clock.produced(runs_out_s - now_s, now_s)
    return job


def names(jobs: list[Job]) -> list[str]:
    return [j.name for j in jobs]


def test_the_earliest_prompt_is_prefilled_when_nothing_is_more_urgent() -> None:
    scheduler = Scheduler(SETTINGS)
    late, early = Job("late", False, submitted_s=1.0), Job("early", False, submitted_s=0.5)
    assert scheduler.next_prefill([late, early], now_s=1.0, chunk_s=0.1) is early
    assert scheduler.next_prefill([playing("d", 3.0)], now_s=1.0, chunk_s=0.1) is None


def test_a_prompt_waits_while_a_stream_would_run_out_during_its_chunk() -> None:
    scheduler = Scheduler(SETTINGS)
    prompt = Job("new", False, submitted_s=1.0)  # due at 1.25
    tight = playing("tight", runs_out_s=1.1, now_s=1.0)  # due at 1.1, a chunk takes 0.2
    assert scheduler.next_prefill([prompt, tight], now_s=1.0, chunk_s=0.2) is None
    # With slack for a chunk before anyone runs out, the prompt goes first.
    relaxed = playing("relaxed", runs_out_s=2.0, now_s=1.0)
    assert scheduler.next_prefill([prompt, relaxed], now_s=1.0, chunk_s=0.2) is prompt
    # Once the prompt is due before the decoders, it goes first however tight they are.
    overdue = Job("overdue", False, submitted_s=0.5)  # due at 0.75
    assert scheduler.next_prefill([overdue, tight], now_s=1.0, chunk_s=0.2) is overdue


def test_decode_steps_go_earliest_deadline_first_and_far_ahead_streams_sit_out() -> None:
    scheduler = Scheduler(SETTINGS)
    ahead = playing("ahead", runs_out_s=10.0)
    soon, sooner = playing("soon", 2.0), playing("sooner", 1.0)
    assert names(scheduler.decode_batch([ahead, soon, sooner], 0.0, False)) == ["sooner", "soon"]
    # Only streams far ahead: they all run (nobody else needs the compute)...
    assert names(scheduler.decode_batch([ahead], 0.0, False)) == ["ahead"]
    # ...unless a prompt waits.
    assert names(scheduler.decode_batch([ahead], 0.0, True)) == []
    # As time passes its lead shrinks and it runs again.
    assert names(scheduler.decode_batch([ahead, soon], 5.0, False)) == ["soon", "ahead"]


def test_only_decoding_jobs_are_batched() -> None:
    scheduler = Scheduler(SETTINGS)
    jobs = [Job("p", False), playing("d", 1.0)]
    assert names(scheduler.decode_batch(jobs, 0.0, True)) == ["d"]
