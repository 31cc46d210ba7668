"""Freed heap goes back to the OS once a load is over (glibc)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from streamtts.heap import release_freed_heap

# In a fresh process: 200 MB of 1 KB buffers (below glibc's mmap threshold: on the heap), all
# freed but the last, which keeps the heap's top in place so that free() alone returns nothing.
SCRIPT = """
import gc
from streamtts.heap import release_freed_heap

def resident_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 1e6

buffers = [bytearray(1024) for _ in range(200_000)]
last = buffers[-1]
del buffers
gc.collect()
before = resident_mb()
released = release_freed_heap()
print(released, before, resident_mb())
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_freed_heap_is_returned_to_the_os() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    released, before_mb, after_mb = result.stdout.split()
    assert released == "True"
    assert float(before_mb) - float(after_mb) > 100  # most of the 200 MB freed


def test_elsewhere_it_says_it_did_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert release_freed_heap() is False
