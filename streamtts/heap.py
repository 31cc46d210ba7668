"""Giving back to the OS the heap a model's load freed.

glibc keeps freed heap memory for reuse instead of returning it, so the copies a load makes and
drops (ONNX graphs cut and re-serialized, staging buffers) stay resident for the life of the
server: loading the bundled Piper voice left 463 MB resident where 335 MB were in use.
``malloc_trim`` returns the free pages.
"""

from __future__ import annotations

import ctypes
import sys


def release_freed_heap() -> bool:
    """Return the process's free heap pages to the OS (glibc's ``malloc_trim(0)``): True if
    some were returned; False where the C library has no such call (not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the process runs on
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
