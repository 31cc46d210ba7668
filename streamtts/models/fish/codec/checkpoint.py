"""Reading a Firefly generator ``.pth`` into plain (weight-norm folded) tensors.

Accepted layouts (spec §1.5): a flat state dict or one nested under ``"state_dict"``; keys with a
``generator.`` prefix (training checkpoints: only those keys are kept, the prefix is dropped);
weight norm stored as ``parametrizations.weight.original0/1`` (new torch API), ``weight_g`` /
``weight_v`` (old API) or already folded into ``weight``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

_NEW_G = ".parametrizations.weight.original0"
_NEW_V = ".parametrizations.weight.original1"
_OLD_G = ".weight_g"
_OLD_V = ".weight_v"
_PREFIX = "generator."


def fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """``w = g * v / ||v||`` with the norm over every dim but 0.

    Dim 0 is the output channel of a Conv1d weight ``[out, in, k]`` but the *input* channel of
    a ConvTranspose1d weight ``[in, out, k]``; upstream normalises over dim 0 in both cases.
    """
    norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))  # [dim0, 1, ...]
    w: Tensor = v * (g / norm)
    return w


def _unwrap(raw: object) -> dict[str, Tensor]:
    if not isinstance(raw, Mapping):
        raise ValueError("vocoder checkpoint is not a state dict")
    if "state_dict" in raw:
        return _unwrap(raw["state_dict"])
    tensors = {str(k): v for k, v in raw.items() if isinstance(v, Tensor)}
    if any("generator" in k for k in tensors):
        tensors = {k.replace(_PREFIX, ""): v for k, v in tensors.items() if _PREFIX in k}
    return tensors


def _fold_all(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for key, value in tensors.items():
        if key.endswith(_NEW_G):
            base = key[: -len(_NEW_G)]
            out[base + ".weight"] = fold_weight_norm(value, tensors[base + _NEW_V])
        elif key.endswith(_OLD_G):
            base = key[: -len(_OLD_G)]
            out[base + ".weight"] = fold_weight_norm(value, tensors[base + _OLD_V])
        elif not key.endswith((_NEW_V, _OLD_V)):
            out[key] = value
    return out


def read_generator_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Flat ``name -> tensor`` map on the CPU with every weight norm folded into ``.weight``."""
    raw = torch.load(Path(path), map_location="cpu", mmap=True, weights_only=True)
    return _fold_all(_unwrap(raw))
