"""Choose and build the engine named by ``Settings.model``."""

from __future__ import annotations

from streamtts.config import Settings
from streamtts.engine import faults
from streamtts.engine.base import Engine
from streamtts.fish.spec import FishSpec
from streamtts.piper.spec import PiperSpec


class ModelSpecError(ValueError):
    pass


def create_engine(settings: Settings) -> Engine:
    spec = settings.model
    piper = PiperSpec.parse(spec)
    if piper is not None:
        from streamtts.piper.engine import PiperEngine

        return PiperEngine(
            piper, settings.piper, settings.voices.library_dir(), settings.scheduling
        )
    fish = FishSpec.parse(spec)
    if fish is not None:
        from streamtts.fish.engine import FishEngine

        return FishEngine(fish, settings.fish, settings.scheduling, job_hook=faults.job_hook())
    raise ModelSpecError(
        f"unknown model {spec!r}: use 'piper', 'piper:/path/voice.onnx', "
        "a Fish-Speech 1.5 checkpoint directory, or 'synthetic:tiny' / 'synthetic:1.5'"
    )
