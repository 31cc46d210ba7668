"""Admission control: tickets, the limit, idempotent release, refusals counted."""

from __future__ import annotations

import pytest

from streamtts.server.admission import Admission


def test_tickets_up_to_the_limit_then_refusals() -> None:
    admission = Admission(2)
    first, second = admission.try_acquire(), admission.try_acquire()
    assert first is not None and second is not None
    assert admission.full and admission.try_acquire() is None and admission.refused == 1
    first.release()
    first.release()  # idempotent: a ticket frees one place once
    assert admission.active == 1 and not admission.full
    third = admission.try_acquire()
    assert third is not None and admission.full
    second.release()
    third.release()
    assert admission.active == 0 and admission.refused == 1


def test_a_limit_below_one_is_an_error() -> None:
    with pytest.raises(ValueError):
        Admission(0)


def test_the_engines_capacity_bounds_admission_below_the_limit() -> None:
    capacity: list[float | None] = [2.7]
    admission = Admission(10, lambda: capacity[0])
    tickets = [admission.try_acquire() for _ in range(3)]
    assert tickets[2] is None and admission.active == 2  # floor(2.7) streams
    assert admission.capacity == 2 and admission.full
    capacity[0] = 50.0  # measured faster: the limit is the cap
    assert admission.capacity == 10
    capacity[0] = None  # not measured: the limit alone
    assert admission.capacity == 10


def test_one_stream_is_admitted_on_an_idle_server_even_below_real_time() -> None:
    admission = Admission(10, lambda: 0.4)
    first = admission.try_acquire()
    assert first is not None and first.beyond_capacity
    assert admission.try_acquire() is None
    first.release()
    assert admission.try_acquire() is not None
