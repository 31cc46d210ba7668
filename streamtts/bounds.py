"""Range checks shared by the settings dataclasses (validated on construction)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any


class SettingsError(ValueError):
    """A setting has a value of the wrong type or out of range."""


def require_bounds(settings: Any, **minimums: float) -> None:
    """Every number of the dataclass ``settings`` is >= 0, and each named one >= its minimum."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise SettingsError(f"{f.name} must be >= 0, got {value}")
    for name, minimum in minimums.items():
        value = getattr(settings, name)
        if value < minimum:
            raise SettingsError(f"{name} must be >= {minimum:g}, got {value}")
