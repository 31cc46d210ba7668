"""The bundled Piper voice, loaded once for the Piper tests: its load finds its contexts and gain,
seconds of work that every test would repeat to the same result. A test that changes the voice
puts it back."""

from __future__ import annotations

import pytest

from streamtts.piper.engine import bundled_voice_paths
from streamtts.piper.stages import StagedVoice, load_voice


@pytest.fixture(scope="session")
def voice() -> StagedVoice:
    model, config = bundled_voice_paths()
    return load_voice(model, config, onnx_threads=1)
