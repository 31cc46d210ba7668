"""One flat buffer for the paired weights, starting on a huge-page boundary.

A decode step streams every paired weight once, and reads memory at the huge-page rate only
where a weight lies in 2 MiB pages. torch (2.13) backs a CPU allocation of 2 MiB or more with
``MADV_HUGEPAGE`` where ``THP_MEM_ALLOC_ENABLE=1`` (:mod:`streamtts.hugepages`), but does not
align it: the kernel can only map the whole 2 MiB pages inside each tensor, so every weight lost
its ragged head and tail to 4 KiB pages, and weights of 2-2.5 MiB nearly all of themselves. On
the 2-core dev CPU (2026-12-07, ``synthetic:1.5`` bf16, read from ``/proc/self/pagemap``) 73%
of the fast layers' and 72% of the slow ones' bytes were on huge pages; laid end to end in one
aligned buffer, in the order a step reads them, all are. ``row_linear`` then read the fast
layers' 120 MB at 55.8 GB/s against 45.5 (batch 1, medians of 30 rounds, the memory summed at
63.8; docs/operations.md, "All the weights on huge pages").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

HUGE_PAGE_BYTES = 2 << 20


def huge_page_aligned_empty(
    numel: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A flat uninitialised tensor of ``numel`` elements whose first byte is 2 MiB-aligned (a
    view of a slightly larger allocation, which it keeps alive)."""
    raw = torch.empty(numel + HUGE_PAGE_BYTES // dtype.itemsize, dtype=dtype, device=device)
    offset = (-raw.data_ptr() % HUGE_PAGE_BYTES) // dtype.itemsize
    return raw[offset : offset + numel]


def arena_slices(
    shapes: Sequence[Sequence[int]], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> list[torch.Tensor]:
    """Contiguous tensors of ``shapes``, end to end in that order in one 2 MiB-aligned buffer.
    Each starts where the previous ends, so each is aligned as far as the sizes before it are
    (the pairs layout's are multiples of 256 bytes)."""
    sizes = [int(torch.Size(shape).numel()) for shape in shapes]
    flat = huge_page_aligned_empty(sum(sizes), dtype, device)
    slices = []
    start = 0
    for shape, size in zip(shapes, sizes, strict=True):
        slices.append(flat[start : start + size].view(*shape))
        start += size
    return slices
