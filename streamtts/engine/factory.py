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
        from streamtts.engine.fish_engine import FishEngine, FishSettings

        return FishEngine(
            spec,
            FishSettings(
                device=settings.device,
                dtype=settings.dtype,
                max_streams=settings.max_streams,
                context_tokens=settings.context_tokens,
                first_chunk_frames=settings.first_chunk_frames,
                chunk_frames=settings.chunk_frames,
                prefill_chunk_tokens=settings.prefill_chunk_tokens,
                max_frames_per_segment=settings.max_frames_per_segment,
                max_lead_s=settings.max_lead_s,
                cpu_threads=settings.cpu_threads,
            ),
        )
    raise ModelSpecError(
        f"unknown model {spec!r}: use 'piper', 'piper:/path/voice.onnx', "
        "a Fish-Speech 1.5 checkpoint directory, or 'synthetic:tiny' / 'synthetic:1.5'"
    )
