"""The KV-cache slots: one per live stream (voice prefixes are kept apart, see prefixes).

Taken and given back from any thread (the event loop opens and closes streams); only integers
here, no tensors.
"""

from __future__ import annotations

import threading


class SlotPool:
    def __init__(self, cache_slots: int) -> None:
        if cache_slots < 1:
            raise ValueError("a cache needs a slot")
        self.capacity = cache_slots
        self._free = list(range(cache_slots))
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def acquire(self) -> int | None:
        """A free slot, or None when every slot is taken."""
        with self._lock:
            return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        with self._lock:
            if slot in self._free or not 0 <= slot < self.capacity:
                raise ValueError(f"slot {slot} is not taken")
            self._free.append(slot)
