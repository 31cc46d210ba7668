"""Swap a model's ``nn.Linear`` layers for other implementations (packed, int8), in place."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def replace_linears_(model: nn.Module, build: Callable[[nn.Linear], nn.Module]) -> int:
    """Replace every ``nn.Linear`` of ``model`` by ``build(layer)``.

    One layer at a time, so each original weight can be freed as soon as its replacement
    exists. Returns how many layers were replaced.
    """
    targets = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name in targets:
        setattr(parent, name, build(getattr(parent, name)))
    return len(targets)
