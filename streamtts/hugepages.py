"""Transparent huge pages for torch's CPU tensors: on by default for the server's process.

A decode step streams every weight once (~1.9 GB for Fish-Speech 1.5 in bf16), so on 4 KiB
pages it walks ~460,000 page-table entries a step. torch backs each CPU allocation of 2 MiB and
more with transparent huge pages when ``THP_MEM_ALLOC_ENABLE=1`` (its allocator ``madvise``s
``MADV_HUGEPAGE``; read once, at its first allocation, so it must be set before torch is
imported). torch 2.13 does not align such an allocation to 2 MiB, so only the whole huge pages
inside it are huge: the paired weights lie in one aligned buffer for that
(:mod:`streamtts.models.fish.fused.arena`). The command line sets it unless the environment
already says otherwise: on the 2-core dev CPU (2026-12-05, bf16, ``synthetic:1.5``, five
alternating pairs) the slow step took 54-57 ms with it against 57-61 ms without, the decode
step 113-126 against 119-139 ms, for ~100 MB more resident memory (docs/operations.md, "Huge
pages"). It takes effect where the kernel's THP mode is ``madvise`` or ``always``
(``/sys/kernel/mm/transparent_hugepage/enabled``), not ``never``.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from pathlib import Path

THP_ENV = "THP_MEM_ALLOC_ENABLE"  # torch's (c10/core/alloc_cpu.cpp)
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS_ROLLUP = Path("/proc/self/smaps_rollup")


def default_on(environ: MutableMapping[str, str] = os.environ) -> None:
    """Turn torch's huge pages on unless ``environ`` already sets them (``0`` keeps them off)."""
    environ.setdefault(THP_ENV, "1")


def kernel_mode(mode_file: Path = THP_MODE) -> str | None:
    """The kernel's THP mode (``always``, ``madvise``, ``never``); None where it has none."""
    try:
        text = mode_file.read_text()
    except OSError:
        return None
    chosen = re.search(r"\[(\w+)\]", text)
    return chosen.group(1) if chosen else None


def huge_pages_mb(smaps_rollup: Path = SMAPS_ROLLUP) -> float | None:
    """This process's memory on transparent huge pages (MB); None where the kernel keeps no
    ``smaps_rollup`` (not Linux)."""
    try:
        text = smaps_rollup.read_text()
    except OSError:
        return None
    found = re.search(r"^AnonHugePages:\s+(\d+) kB$", text, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else 0.0


def summary(
    environ: MutableMapping[str, str] = os.environ,
    mode_file: Path = THP_MODE,
    smaps_rollup: Path = SMAPS_ROLLUP,
) -> str:
    """One line for the server's start log: what torch was told, what the kernel allows, and
    how much of the process is on huge pages."""
    mode = kernel_mode(mode_file) or "unknown"
    held_mb = huge_pages_mb(smaps_rollup)
    held = "unknown" if held_mb is None else f"{held_mb:.0f} MB"
    return (
        f"huge pages: {held} of the process ({THP_ENV}={environ.get(THP_ENV, 'unset')}, "
        f"kernel THP mode {mode})"
    )
