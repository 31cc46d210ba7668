"""Settings of the Piper runtime."""

from __future__ import annotations

from dataclasses import dataclass

from streamtts.bounds import require_bounds
from streamtts.piper.calibration_cache import CalibrationCache, cache_directory


@dataclass(frozen=True)
class PiperSettings:
    # Worker threads, each running one synthesis job at a time (earliest deadline first).
    engine_threads: int = 2
    # ONNX Runtime intra-op threads per synthesis: workers x threads should not exceed the cores.
    piper_onnx_threads: int = 1
    # A segment is cut into jobs of at most this many characters, at clause boundaries.
    piper_max_job_chars: int = 100
    # Where a voice's calibration and its graph as it runs are kept between starts (a later
    # start takes ~5 s less); "": $XDG_CACHE_HOME/streamtts/piper, else ~/.cache/streamtts/piper;
    # "off": none.
    piper_calibration_cache: str = ""

    def __post_init__(self) -> None:
        require_bounds(self, engine_threads=1, piper_onnx_threads=1, piper_max_job_chars=20)

    def calibration_cache(self) -> CalibrationCache | None:
        directory = cache_directory(self.piper_calibration_cache)
        return None if directory is None else CalibrationCache(directory)
