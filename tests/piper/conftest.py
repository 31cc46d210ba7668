"""The bundled Piper voice, loaded once for the Piper tests: its load finds its contexts and gain,
seconds of work that every test would repeat to the same result. A test that changes the voice
puts it back. Its graph cut into stages is shared too (tests only read it)."""

from __future__ import annotations

from typing import Any

import onnx
import pytest

from streamtts.piper.engine import bundled_voice_paths
from streamtts.piper.load import load_voice
from streamtts.piper.stages import StagedVoice, Stages, split_graph


@pytest.fixture(scope="session")
def voice() -> StagedVoice:
    model, config = bundled_voice_paths()
    return load_voice(model, config, onnx_threads=1)


@pytest.fixture(scope="session")
def split() -> Stages[Any]:
    model, _ = bundled_voice_paths()
    found = split_graph(onnx.load(str(model)))
    assert found is not None
    return found
