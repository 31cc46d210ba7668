"""Piper's deadline-first worker threads and how a segment is cut into jobs."""

from __future__ import annotations

import threading

import pytest

from streamtts.piper.workers import DeadlineWorkers, job_pieces


def test_jobs_run_earliest_deadline_first() -> None:
    workers = DeadlineWorkers(1, "test")
    gate, started = threading.Event(), threading.Event()
    order: list[str] = []

    def hold() -> None:  # holds the only thread while the rest queue
        started.set()
        gate.wait()

    blocker = workers.submit(0.0, hold)
    assert started.wait(10)
    futures = [
        workers.submit(deadline, lambda name=name: order.append(name))
        for deadline, name in ((3.0, "c"), (1.0, "a"), (2.0, "b"), (1.0, "a2"))
    ]
    assert workers.queued == 4
    gate.set()
    for f in [blocker, *futures]:
        f.result(timeout=10)
    assert order == ["a", "a2", "b", "c"]  # ties in arrival order
    workers.shutdown()


def test_errors_reach_the_submitter_and_shutdown_cancels_the_queue() -> None:
    workers = DeadlineWorkers(1, "test")
    with pytest.raises(ZeroDivisionError):
        workers.submit(0.0, lambda: 1 / 0).result(timeout=10)
    gate, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return gate.wait()

    running = workers.submit(0.0, hold)
    assert started.wait(10)
    queued = workers.submit(1.0, lambda: None)
    workers.shutdown()
    gate.set()
    assert queued.cancelled() and running.result(timeout=10) is True
    with pytest.raises(RuntimeError):
        workers.submit(0.0, lambda: None)


def test_long_segments_are_cut_at_clauses_short_ones_kept() -> None:
    text = (
        "When the tide came in, the boats rose with it, and the fishermen, who had waited all "
        "night on the pier, finally went out to sea before the sun came up."
    )
    pieces = job_pieces(text, 60)
    assert len(pieces[0]) <= 30 and all(len(p) <= 60 for p in pieces) and len(pieces) >= 3
    for i, piece in enumerate(pieces[1:], start=1):  # each at most the pieces before it
        assert len(piece) <= max(30, sum(map(len, pieces[:i])))
    assert " ".join(pieces) == text
    assert all(p.endswith((",", ".")) for p in pieces[:-1])
    assert job_pieces("Short.", 60) == ["Short."]
    # no space at all: 30, then 30 (what came before), then 60
    assert job_pieces("x" * 170, 60) == ["x" * 30, "x" * 30, "x" * 60, "x" * 50]
    assert job_pieces("   ", 60) == []
