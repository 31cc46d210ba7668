"""Cached left context of causal layers: what makes chunked decoding exact.

A causal layer with receptive width ``W`` (``K - 1`` for a stride-1 conv of effective kernel
``K``; ``ceil(k / s) - 1`` input columns for a transposed conv) needs only the last ``W`` input
columns of everything it has seen. Decoding from scratch is the same as starting from ``W``
zero columns. :class:`LeftContext` carries those columns for every layer of one batched call:
``past`` in, ``next`` out.

Ragged batches: streams may bring different numbers of new frames. The new frames of stream
``b`` occupy the first ``frames[b]`` frame slots of the padded time axis (junk after them); since
every layer is causal the junk never reaches valid outputs, and each stream's next context is
gathered so that it ends at its own last valid column.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def is_time_major(x: Tensor) -> bool:
    """A [B, C, T] tensor stored as [B, T, C] (packed decoders' layout, oneDNN's channels-last).

    Several channels and columns are needed to tell: with one of either both layouts coincide.
    """
    return x.dim() == 3 and x.shape[1] > 1 and x.shape[2] > 1 and x.stride(1) == 1


class LeftContext:
    """Left context of every causal layer for one batched incremental call.

    ``past[i]``: ``[B, C_i, W_i]`` for layer slot ``i``; ``frames[b]``: new code frames of
    stream ``b`` (the padded time axis holds ``max(frames)`` frames).
    """

    def __init__(self, past: Sequence[Tensor], frames: Sequence[int]) -> None:
        self.past = list(past)
        self.next: list[Tensor] = list(past)
        self.max_frames = max(frames)
        self.uniform = all(n == self.max_frames for n in frames)
        self._frames = list(frames)
        self._frames_dev: Tensor | None = None  # [B] int64, built on first ragged use
        self._ranges: dict[int, Tensor] = {}

    def extend(self, slot: int, x: Tensor) -> Tensor:
        """Prepend layer ``slot``'s cached columns to ``x`` [B, C, T] -> [B, C, W + T]."""
        past = self.past[slot]  # [B, C, W]
        width = past.shape[-1]
        past = past.to(x.dtype)
        if is_time_major(x):  # join in x's memory order
            xp = torch.cat((past.transpose(1, 2), x.transpose(1, 2)), dim=1).transpose(1, 2)
        else:
            xp = torch.cat((past, x), dim=-1)  # [B, C, W + T]
        self.next[slot] = self._tail(xp, width, x.shape[-1] // self.max_frames)
        return xp

    def _tail(self, xp: Tensor, width: int, cols_per_frame: int) -> Tensor:
        """Each stream's last ``width`` valid columns of ``xp`` -> [B, C, W] (a copy)."""
        if self.uniform:
            return xp[:, :, xp.shape[-1] - width :].clone()
        if self._frames_dev is None:
            self._frames_dev = torch.tensor(self._frames, dtype=torch.int64).to(
                xp.device, non_blocking=True
            )
        cols = self._ranges.get(width)
        if cols is None:
            cols = self._ranges[width] = torch.arange(width, device=xp.device)
        # Stream b's valid columns end at W + frames[b] * cols_per_frame, so its tail starts at
        # frames[b] * cols_per_frame.
        start = self._frames_dev * cols_per_frame  # [B]
        index = (start[:, None] + cols[None, :]).unsqueeze(1)  # [B, 1, W]
        return xp.gather(2, index.expand(-1, xp.shape[1], -1))  # [B, C, W]


def assign_context_slots(root: torch.nn.Module) -> list[tuple[int, int]]:
    """Number every causal layer under ``root`` that needs context; return ``(C, W)`` per slot.

    A causal layer is any module with ``context_width`` (W, columns kept), ``in_channels`` (C)
    and a writable ``context_slot``. Layers are found in ``root.modules()`` order, so slots are
    stable for a given architecture.
    """
    shapes: list[tuple[int, int]] = []
    for module in root.modules():
        width = getattr(module, "context_width", 0)
        if isinstance(width, int) and width > 0:
            setattr(module, "context_slot", len(shapes))  # noqa: B010
            shapes.append((int(getattr(module, "in_channels")), width))  # noqa: B009
    return shapes
