"""Grouped finite scalar quantisation (FSQ) of the Firefly codec (spec §5.5).

The latent ``[B, C, T]`` is split into ``G`` contiguous channel groups; each group is projected
to ``len(levels)`` scalars that are bounded and rounded to a small integer lattice. A frame is
therefore ``G`` indices in ``0 .. prod(levels) - 1`` (1000 for levels 8,5,5,5).

Out-of-range indices. The LLM's codebooks have 1024 entries but the codec only 1000, so a
sampled index 1000..1023 (or any negative one) has no meaning here; upstream raises. We never
fail a stream for it: such an index is replaced by the *centre* of the lattice (every scalar 0,
index 500 for the released levels), the least informative point, equidistant from all others,
whose latent is just ``project_out``'s bias. Clamping would instead pick the lattice corner with
every scalar at its maximum (the most extreme latent) and ``% 1000`` an arbitrary one. Each
replacement is counted in :data:`out_of_range_codes_total`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
from torch import Tensor, nn

_BOUND_EPS = 1e-3  # widens each half range slightly so tanh never reaches a rounding edge


class DeviceCounter:
    """Thread-safe monotonic counter that can be fed device tensors without a host sync.

    ``add`` only enqueues an in-place device add; ``value`` (called by /metrics) reads back.
    """

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self._lock = threading.Lock()
        self._host = 0
        self._pending: dict[torch.device, Tensor] = {}

    def add(self, count: Tensor) -> None:
        """Add a 0-d integer tensor (on any device)."""
        with self._lock:
            acc = self._pending.get(count.device)
            if acc is None:
                self._pending[count.device] = count.detach().to(torch.int64, copy=True)
            else:
                acc.add_(count)

    def inc(self, amount: int = 1) -> None:
        with self._lock:
            self._host += amount

    def value(self) -> int:
        with self._lock:
            for acc in self._pending.values():
                self._host += int(acc.item())
            self._pending.clear()
            return self._host


out_of_range_codes_total = DeviceCounter(
    "streamtts_vocoder_out_of_range_codes_total",
    "Codes outside the codec's codebook (e.g. LLM indices 1000..1023), replaced by the "
    "neutral code.",
)


@dataclass(frozen=True)
class FsqLattice:
    """Per-dimension constants of one FSQ layer for ``levels`` (e.g. 8,5,5,5)."""

    levels: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.levels)

    @property
    def dims(self) -> int:
        return len(self.levels)

    @property
    def half_width(self) -> tuple[int, ...]:
        return tuple(level // 2 for level in self.levels)

    @property
    def basis(self) -> tuple[int, ...]:
        return tuple(math.prod(self.levels[:d]) for d in range(self.dims))

    @property
    def neutral_index(self) -> int:
        """Index of the all-zero code (500 for 8,5,5,5); replaces out-of-range indices."""
        return sum(h * b for h, b in zip(self.half_width, self.basis, strict=True))

    def bound(self, z: Tensor) -> Tensor:
        """``tanh(z + shift) * half_l - offset`` per dimension. z: [..., dims] fp32."""
        half_l = torch.tensor(
            [(lv - 1) * (1 + _BOUND_EPS) / 2 for lv in self.levels], device=z.device
        )
        offset = torch.tensor([0.5 if lv % 2 == 0 else 0.0 for lv in self.levels], device=z.device)
        shift = torch.atanh(offset / half_l)
        return torch.tanh(z + shift) * half_l - offset

    def indices(self, rounded: Tensor) -> Tensor:
        """Integer lattice points [..., dims] -> flat indices [...] (int32)."""
        half_width = torch.tensor(self.half_width, device=rounded.device)
        basis = torch.tensor(self.basis, device=rounded.device)
        level_idx = rounded.to(torch.int64) + half_width  # [..., dims] in 0 .. level-1
        return (level_idx * basis).sum(dim=-1).to(torch.int32)

    def codes(self) -> Tensor:
        """Every index's normalised code, [size, dims] fp32 in [-1, 1]."""
        idx = torch.arange(self.size)  # [size]
        cols = []
        for level, half, base in zip(self.levels, self.half_width, self.basis, strict=True):
            level_idx = (idx // base) % level
            cols.append((level_idx - half).to(torch.float32) / half)
        return torch.stack(cols, dim=-1)  # [size, dims]


class FsqDecoder(nn.Module):
    """Indices ``[B, G, T]`` -> latent ``[B, G*D, T]`` through a precomputed lookup table.

    ``table[g, i] = project_out[g](code(i))`` is rebuilt by :meth:`refresh_table` whenever the
    ``project_out`` weights change (the loader calls it).
    """

    table: Tensor

    def __init__(self, dim: int, n_groups: int, levels: tuple[int, ...]) -> None:
        super().__init__()
        self.lattice = FsqLattice(levels)
        self.n_groups = n_groups
        self.group_dim = dim // n_groups
        self.project_out = nn.ModuleList(
            nn.Linear(self.lattice.dims, self.group_dim) for _ in range(n_groups)
        )
        self.register_buffer("table", torch.empty(0), persistent=False)

    @torch.no_grad()
    def refresh_table(self) -> None:
        first = self.project_out[0]
        assert isinstance(first, nn.Linear)
        codes = self.lattice.codes().to(first.weight.device, first.weight.dtype)  # [K, dims]
        rows = [proj(codes) for proj in self.project_out]  # G x [K, D]
        self.table = torch.cat(rows, dim=0)  # [G*K, D]

    def sanitize(self, indices: Tensor) -> Tensor:
        """Replace out-of-range indices by the neutral one and count them. [B, G, T] int."""
        valid = (indices >= 0) & (indices < self.lattice.size)  # [B, G, T] bool
        out_of_range_codes_total.add((~valid).sum())
        return torch.where(valid, indices, self.lattice.neutral_index)

    def forward(self, indices: Tensor) -> Tensor:
        """indices [B, G, T] (any int dtype) -> latent [B, G*D, T] in the table's dtype."""
        batch, groups, frames = indices.shape
        idx = self.sanitize(indices).to(torch.int64)  # [B, G, T]
        offsets = torch.arange(groups, device=idx.device) * self.lattice.size  # [G]
        flat = idx + offsets.view(1, groups, 1)  # [B, G, T] rows of table
        latent = nn.functional.embedding(flat, self.table)  # [B, G, T, D]
        return latent.permute(0, 1, 3, 2).reshape(batch, groups * self.group_dim, frames)


class FsqEncoder(nn.Module):
    """Latent ``[B, G*D, T]`` -> indices ``[B, G, T]`` (int32). Runs in fp32, no autocast."""

    def __init__(self, dim: int, n_groups: int, levels: tuple[int, ...]) -> None:
        super().__init__()
        self.lattice = FsqLattice(levels)
        self.n_groups = n_groups
        self.project_in = nn.ModuleList(
            nn.Linear(dim // n_groups, self.lattice.dims) for _ in range(n_groups)
        )

    def pre_round(self, latent: Tensor) -> Tensor:
        """The values FSQ rounds: ``bound(bound(project_in(x_g)))`` -> [B, G, T, dims].

        The double bound is upstream's: the residual wrapper bounds once, the FSQ layer again.
        """
        with torch.autocast(latent.device.type, enabled=False):
            x = latent.float().transpose(1, 2)  # [B, T, C]
            groups = x.chunk(self.n_groups, dim=-1)  # G x [B, T, D]
            bounded = [
                self.lattice.bound(self.lattice.bound(proj(g).float()))
                for proj, g in zip(self.project_in, groups, strict=True)
            ]
            return torch.stack(bounded, dim=1)  # [B, G, T, dims]

    def forward(self, latent: Tensor) -> Tensor:
        return self.lattice.indices(torch.round(self.pre_round(latent)))  # [B, G, T]
