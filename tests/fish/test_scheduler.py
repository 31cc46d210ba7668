"""The generator's per-iteration choice, with fake jobs and a fake clock."""

from __future__ import annotations

from dataclasses import dataclass

from streamtts.fish.scheduler import Scheduler


@dataclass
class Stream:
    lead_s: float

    def audio_lead_s(self, now_s: float) -> float:
        return self.lead_s - now_s


@dataclass
class Job:
    name: str
    decoding: bool
    stream: Stream


def names(jobs: list[Job]) -> list[str]:
    return [j.name for j in jobs]


def test_prompts_are_prefilled_in_arrival_order() -> None:
    scheduler = Scheduler(max_lead_s=6.0)
    jobs = [Job("a", True, Stream(0)), Job("b", False, Stream(0)), Job("c", False, Stream(0))]
    chosen = scheduler.next_prefill(jobs)
    assert chosen is not None and chosen.name == "b"
    assert scheduler.next_prefill([jobs[0]]) is None


def test_streams_far_ahead_sit_out_while_others_need_compute() -> None:
    scheduler = Scheduler(max_lead_s=6.0)
    ahead, behind = Job("ahead", True, Stream(10.0)), Job("behind", True, Stream(1.0))
    assert names(scheduler.decode_batch([ahead, behind], 0.0, False)) == ["behind"]
    # Only streams far ahead: they all run (nobody else needs the compute).
    assert names(scheduler.decode_batch([ahead], 0.0, False)) == ["ahead"]
    # A waiting prompt needs compute: the stream far ahead sits out, even alone.
    assert names(scheduler.decode_batch([ahead], 0.0, True)) == []
    # As time passes its lead shrinks and it runs again.
    assert names(scheduler.decode_batch([ahead, behind], 5.0, False)) == ["ahead", "behind"]


def test_only_decoding_jobs_are_batched() -> None:
    scheduler = Scheduler(max_lead_s=6.0)
    jobs = [Job("p", False, Stream(0)), Job("d", True, Stream(0))]
    assert names(scheduler.decode_batch(jobs, 0.0, True)) == ["d"]
