"""The paired weights' buffer: 2 MiB-aligned, slices end to end in the order asked."""

from __future__ import annotations

import pytest
import torch

from streamtts.models.fish.fused.arena import (
    HUGE_PAGE_BYTES,
    arena_slices,
    huge_page_aligned_empty,
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8])
def test_an_aligned_tensor_starts_on_a_huge_page(dtype: torch.dtype) -> None:
    kept = [torch.empty(3 << 20, dtype=torch.uint8)]  # allocations of any size before it
    for numel in (1, 1000, (5 << 20) + 3):
        flat = huge_page_aligned_empty(numel, dtype)
        kept.append(flat)
        assert flat.data_ptr() % HUGE_PAGE_BYTES == 0
        assert flat.shape == (numel,) and flat.dtype == dtype and flat.is_contiguous()
        flat.fill_(1)  # all of it is writable memory of its own
        assert bool((flat == 1).all())


def test_slices_lie_end_to_end_in_order_and_do_not_overlap() -> None:
    shapes = [(2, 3, 64, 2), (1, 5, 64, 2), (4, 1, 64, 2)]
    slices = arena_slices(shapes, torch.bfloat16)
    assert [tuple(s.shape) for s in slices] == shapes
    assert slices[0].data_ptr() % HUGE_PAGE_BYTES == 0
    for before, after in zip(slices, slices[1:], strict=False):
        assert after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()
        assert after.untyped_storage().data_ptr() == before.untyped_storage().data_ptr()
    for value, piece in enumerate(slices):
        piece.fill_(value)
    assert [int(piece.float().mean()) for piece in slices] == [0, 1, 2]
    assert all(piece.is_contiguous() for piece in slices)
