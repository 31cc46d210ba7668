"""What ``Settings.model`` names for the Fish runtime: a checkpoint directory or a synthetic model.

``synthetic:<size>`` (``tiny``, ``1.5``) is the Fish-Speech architecture with seeded random
weights: it costs what the real model costs and produces **noise, never speech**, and exists so
tests and benchmarks run the real code path without downloaded weights. Torch-free (the factory
reads it to choose an engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SYNTHETIC_PREFIX = "synthetic:"


@dataclass(frozen=True)
class FishSpec:
    text: str
    directory: Path | None = None  # a Fish-Speech 1.5 checkpoint directory
    synthetic_size: str | None = None  # or a synthetic model of this size

    @classmethod
    def parse(cls, spec: str) -> FishSpec | None:
        """The spec, or None when ``spec`` names no Fish model."""
        if spec.startswith(SYNTHETIC_PREFIX):
            return cls(spec, synthetic_size=spec.removeprefix(SYNTHETIC_PREFIX))
        directory = Path(spec).expanduser()
        return cls(spec, directory=directory) if directory.is_dir() else None

    @property
    def synthetic(self) -> bool:
        return self.synthetic_size is not None

    @property
    def engine_name(self) -> str:
        """The name ``/v1/models`` shows: ``fish``, or ``fish:synthetic:<size>``."""
        return f"fish:{self.text}" if self.synthetic else "fish"

    @property
    def voice_description(self) -> str:
        if self.synthetic:
            return "synthetic random weights: noise, not speech"
        return "the model's own voice (no reference)"
