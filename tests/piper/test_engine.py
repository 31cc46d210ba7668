"""The bundled Piper voice through the engine contract: speed honoured, the rest refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from streamtts.engine.base import InvalidOptionError
from streamtts.options import SynthesisOptions
from streamtts.piper.engine import PiperEngine
from streamtts.piper.settings import PiperSettings
from streamtts.piper.spec import PiperSpec
from tests.torch_guard import no_torch_on_this_thread

TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture
async def engine() -> AsyncIterator[PiperEngine]:
    engine = PiperEngine(PiperSpec(), PiperSettings(engine_threads=1))
    await engine.start()
    yield engine
    await engine.stop()


async def speak(engine: PiperEngine, options: SynthesisOptions) -> np.ndarray:
    stream = engine.open_stream(engine.default_voice, options)
    audio = np.concatenate([pcm async for pcm in stream.synthesize(TEXT)])
    stream.close()
    return audio


async def test_speed_changes_the_duration(engine: PiperEngine) -> None:
    normal = await speak(engine, SynthesisOptions())
    fast = await speak(engine, SynthesisOptions(speed=2.0))
    # Piper draws its phoneme durations at random (noise_w), so the ratio varies around 0.5.
    assert 0.35 < fast.size / normal.size < 0.72
    assert engine.sample_rate == 22050 and engine.describe()["engine"] == "piper"


@pytest.mark.parametrize(
    "options",
    [SynthesisOptions(seed=1), SynthesisOptions(temperature=0.9), SynthesisOptions(chunk_frames=2)],
)
async def test_options_piper_cannot_honour_are_refused(
    engine: PiperEngine, options: SynthesisOptions
) -> None:
    with pytest.raises(InvalidOptionError, match="not supported by the piper engine"):
        engine.open_stream(engine.default_voice, options)


async def test_the_event_loop_runs_no_torch(engine: PiperEngine) -> None:
    with no_torch_on_this_thread():
        assert (await speak(engine, SynthesisOptions())).size > 0


async def test_every_segment_of_a_stream_is_spoken(engine: PiperEngine) -> None:
    """A stream's later segments are not lost to the race between a segment's end and its
    worker thread returning."""
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    sizes = []
    for text in ["One.", "Two words.", "Three more words.", "Four.", "Five now.", "Six."] * 2:
        sizes.append(sum([pcm.size async for pcm in stream.synthesize(text)]))
    stream.close()
    assert all(size > 2000 for size in sizes), sizes  # none was lost after the one before it
    assert stream.stats.segments == len(sizes)
