"""Swap a model's ``nn.Linear`` layers for other implementations (packed, int8), in place."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from torch import nn


def module_ids(parts: Iterable[nn.Module]) -> set[int]:
    """``id`` of every module inside ``parts`` (themselves included)."""
    return {id(m) for part in parts for m in part.modules()}


def replace_linears_(
    model: nn.Module,
    build: Callable[[nn.Linear], nn.Module],
    skip: tuple[nn.Module, ...] = (),
) -> int:
    """Replace every ``nn.Linear`` of ``model`` outside ``skip`` by ``build(layer)``.

    One layer at a time, so each original weight can be freed as soon as its replacement
    exists. Returns how many layers were replaced.
    """
    skipped = module_ids(skip)
    targets = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and id(child) not in skipped
    ]
    for parent, name in targets:
        setattr(parent, name, build(getattr(parent, name)))
    return len(targets)
