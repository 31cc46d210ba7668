"""Choose and build the engine named by ``Settings.model``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from streamtts.config import Settings
from streamtts.engine.base import Engine


class ModelSpecError(ValueError):
    pass


def create_engine(settings: Settings) -> Engine:
    spec = settings.model
    if spec == "piper" or spec.startswith("piper:"):
        from streamtts.piper.engine import PiperEngine

        path = Path(spec.split(":", 1)[1]).expanduser() if ":" in spec else None
        return PiperEngine(path, threads=settings.engine_threads)
    if spec.startswith("synthetic:") or Path(spec).expanduser().is_dir():
        from streamtts.fish.engine import FishEngine, FishSettings

        # FishSettings' fields are named as the server settings they come from.
        names = [f.name for f in dataclasses.fields(FishSettings)]
        return FishEngine(spec, FishSettings(**{n: getattr(settings, n) for n in names}))
    raise ModelSpecError(
        f"unknown model {spec!r}: use 'piper', 'piper:/path/voice.onnx', "
        "a Fish-Speech 1.5 checkpoint directory, or 'synthetic:tiny' / 'synthetic:1.5'"
    )
