"""Choose and build the engine named by ``Settings.model``."""

from __future__ import annotations

from dataclasses import replace

from streamtts.config import Settings
from streamtts.engine import faults
from streamtts.engine.base import Engine
from streamtts.fish.spec import FishSpec
from streamtts.piper.spec import PiperSpec


class ModelSpecError(ValueError):
    pass


def create_engine(settings: Settings, offline: bool = False) -> Engine:
    """The engine ``settings`` name. ``offline``: for one stream (``streamtts say``), which
    nothing admits: a Piper engine measures no cost under load at start (half a second of a
    one-second ``say``), a Fish engine holds one slot (one warm-up stream, one compiled
    bucket)."""
    spec = settings.model
    piper = PiperSpec.parse(spec)
    if piper is not None:
        from streamtts.piper.engine import PiperEngine

        return PiperEngine(
            piper,
            settings.piper,
            settings.voices.library_dir(),
            settings.scheduling,
            measure_cost=not offline,
        )
    fish = FishSpec.parse(spec)
    if fish is not None:
        from streamtts.fish.engine import FishEngine

        fish_settings = replace(settings.fish, max_streams=1) if offline else settings.fish
        return FishEngine(fish, fish_settings, settings.scheduling, job_hook=faults.job_hook())
    raise ModelSpecError(
        f"unknown model {spec!r}: use 'piper', 'piper:/path/voice.onnx', "
        "a Fish-Speech 1.5 checkpoint directory, or 'synthetic:tiny' / 'synthetic:1.5'"
    )
