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
