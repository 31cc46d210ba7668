"""bf16's spacing, for tests that allow a kernel's result to be a rounding step apart."""

from __future__ import annotations

import torch


def bf16_step(values: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at ``values`` (8 significant bits)."""
    exponent = torch.frexp(values.abs().clamp(min=2.0**-100)).exponent
    return torch.ldexp(torch.ones_like(values), exponent - 8)
