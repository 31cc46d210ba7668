"""Settings of the Piper runtime."""

from __future__ import annotations

from dataclasses import dataclass

from streamtts.bounds import require_bounds


@dataclass(frozen=True)
class PiperSettings:
    # Worker threads, each running one synthesis job at a time (earliest deadline first).
    engine_threads: int = 2
    # ONNX Runtime intra-op threads per synthesis: workers x threads should not exceed the cores.
    piper_onnx_threads: int = 1
    # A segment is cut into jobs of at most this many characters, at clause boundaries.
    piper_max_job_chars: int = 100

    def __post_init__(self) -> None:
        require_bounds(self, engine_threads=1, piper_onnx_threads=1, piper_max_job_chars=20)
