"""Settings of the Piper runtime."""

from __future__ import annotations

from dataclasses import dataclass

from streamtts.bounds import require_bounds


@dataclass(frozen=True)
class PiperSettings:
    # Worker threads, each running one synthesis at a time.
    engine_threads: int = 2

    def __post_init__(self) -> None:
        require_bounds(self, engine_threads=1)
