"""Choose and build the engine named by ``Settings.model``."""

from __future__ import annotations

from pathlib import Path

from streamtts.config import Settings
from streamtts.engine.base import Engine


class ModelSpecError(ValueError):
    pass


def create_engine(settings: Settings) -> Engine:
    spec = settings.model
    if spec == "piper" or spec.startswith("piper:"):
        from streamtts.models.piper import PiperEngine

        path = Path(spec.split(":", 1)[1]).expanduser() if ":" in spec else None
        return PiperEngine(path, threads=settings.engine_threads)
    if spec.startswith("synthetic:") or Path(spec).expanduser().is_dir():
        raise ModelSpecError(
            f"model {spec!r}: the Fish-Speech streaming engine is not part of this build yet; "
            "use --model piper"
        )
    raise ModelSpecError(
        f"unknown model {spec!r}: use 'piper', 'piper:/path/voice.onnx', "
        "a Fish-Speech 1.5 checkpoint directory, or 'synthetic:tiny' / 'synthetic:1.5'"
    )
