"""KV-cache slots: one per stream, taken and given back exactly once."""

from __future__ import annotations

import pytest

from streamtts.fish.slots import SlotPool


def test_slots_are_taken_until_none_is_left_and_given_back() -> None:
    pool = SlotPool(cache_slots=2)
    assert pool.capacity == 2 and pool.free == 2
    a, b = pool.acquire(), pool.acquire()
    assert {a, b} == {0, 1} and pool.acquire() is None and pool.free == 0
    assert a is not None
    pool.release(a)
    assert pool.free == 1 and pool.acquire() == a


def test_a_slot_is_given_back_once() -> None:
    pool = SlotPool(cache_slots=2)
    slot = pool.acquire()
    assert slot is not None
    pool.release(slot)
    with pytest.raises(ValueError):
        pool.release(slot)
    with pytest.raises(ValueError):
        pool.release(7)
    with pytest.raises(ValueError):
        SlotPool(cache_slots=0)
