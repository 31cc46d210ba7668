"""The bundled Piper voice through the engine contract: speed honoured, the rest refused."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts.config import Settings
from streamtts.engine.base import InvalidOptionError, StreamStats
from streamtts.engine.factory import create_engine
from streamtts.engine.handoff import PcmHandoff
from streamtts.options import SynthesisOptions
from streamtts.piper import engine as piper_engine
from streamtts.piper.engine import HEAD_FRAMES, PiperEngine, _PiperStream, bundled_voice_paths
from streamtts.piper.settings import PiperSettings
from streamtts.piper.spec import PiperSpec
from streamtts.piper.stages import Sentence, StagedVoice, matches, run_options
from streamtts.voices.settings import VoiceSettings
from tests.piper_speed import SPEED_2_DURATION_RATIO
from tests.torch_guard import no_torch_on_this_thread

TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture
async def engine(voice: StagedVoice, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[PiperEngine]:
    """An engine on the shared voice (tests/piper/conftest.py) instead of a load of its own."""

    def loaded(
        model: Path, config: Path, onnx_threads: int, calibration_threads: int, cache: Any
    ) -> StagedVoice:
        # Calibrated on every worker while nothing is served yet.
        assert (model, config, onnx_threads, calibration_threads) == (*bundled_voice_paths(), 1, 1)
        return voice

    monkeypatch.setattr(piper_engine, "load_voice", loaded)
    engine = PiperEngine(PiperSpec(), PiperSettings(engine_threads=1))
    await engine.start()
    yield engine
    await engine.stop()


async def test_the_voice_is_calibrated_on_every_worker(
    voice: StagedVoice, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With two workers the voice loads with two calibration threads (the fixture's one
    worker cannot tell that from a constant) and the calibration cache the settings name;
    admission starts from a measured cost."""
    calls: list[tuple[Path, Path, int, int, Path | None]] = []

    def loaded(
        model: Path, config: Path, onnx_threads: int, calibration_threads: int, cache: Any
    ) -> Any:
        calls.append((model, config, onnx_threads, calibration_threads, cache.directory))
        return voice

    monkeypatch.setattr(piper_engine, "load_voice", loaded)
    settings = PiperSettings(engine_threads=2, piper_calibration_cache=str(tmp_path))
    engine = PiperEngine(PiperSpec(), settings)
    await engine.start()
    try:
        assert calls == [(*bundled_voice_paths(), 1, 2, tmp_path)]  # the setting's folder
        assert engine.cost.cost(1) is not None and engine.capacity().realtime_streams
    finally:
        await engine.stop()


async def test_an_offline_engine_learns_its_cost_from_what_it_makes(
    voice: StagedVoice, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``streamtts say`` (``create_engine(offline=True)``): one stream, nothing to admit, so
    nothing is measured at start; the first sentence it makes gives the cost."""
    monkeypatch.setattr(piper_engine, "load_voice", lambda *_, **__: voice)
    measured: list[int] = []

    def under_load(*_: Any) -> tuple[float, float]:
        measured.append(1)
        return 1.0, 1.0

    monkeypatch.setattr(piper_engine, "cost_under_load", under_load)
    settings = Settings(
        piper=PiperSettings(engine_threads=2), voices=VoiceSettings(voices_dir=str(tmp_path))
    )
    engine = create_engine(settings, offline=True)
    assert isinstance(engine, PiperEngine)
    await engine.start()
    try:
        assert measured == [] and engine.cost.cost(1) is None
        stream = engine.open_stream(engine.default_voice, SynthesisOptions())
        audio = [pcm async for pcm in stream.synthesize(TEXT)]
        stream.close()
        assert sum(a.size for a in audio) > voice.sample_rate  # over a second of speech
        cost = engine.cost.cost(1)
        assert cost is not None and cost > 0  # learned (its size is the machine's speed)
    finally:
        await engine.stop()
    serving = create_engine(settings)
    await serving.start()
    try:
        assert measured == [1, 1]  # a server measures on every worker at start
    finally:
        await serving.stop()


async def test_voices_of_the_folder_come_and_go_and_a_damaged_one_is_skipped(
    voice: StagedVoice, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A model with its config in the voices folder is offered once found; removed, it is no
    longer offered; one that does not load is skipped (logged) and the others still load.
    After voices were loaded, the freed heap goes back to the OS."""
    bundled_model, bundled_config = bundled_voice_paths()
    for voice_id in ("de_DE-test-medium", "fr_FR-damaged-low"):
        (tmp_path / f"{voice_id}.onnx.json").write_bytes(bundled_config.read_bytes())
    (tmp_path / "de_DE-test-medium.onnx").symlink_to(bundled_model)
    (tmp_path / "fr_FR-damaged-low.onnx").write_bytes(b"not an onnx model")
    (tmp_path / "no_NO-configless-x_low.onnx").symlink_to(bundled_model)  # no config: not a voice
    loaded: list[str] = []

    def load(
        model: Path,
        config: Path,
        onnx_threads: int,
        calibration_threads: int = 1,
        cache: Any = None,
    ) -> Any:
        if model.parent == tmp_path:
            loaded.append(model.name)
            if "damaged" in model.name:
                raise ValueError("not an onnx model")
        return voice

    trims: list[bool] = []
    monkeypatch.setattr(piper_engine, "load_voice", load)
    monkeypatch.setattr(piper_engine, "release_freed_heap", lambda: trims.append(True) or True)
    engine = PiperEngine(PiperSpec(), PiperSettings(engine_threads=1), voices_dir=tmp_path)
    await engine.start()
    try:
        offered = {v.id: v.language for v in engine.voices()}
        assert offered == {"en_US-joe-medium": "en-US", "de_DE-test-medium": "de-DE"}
        assert sorted(loaded) == ["de_DE-test-medium.onnx", "fr_FR-damaged-low.onnx"]
        assert trims == [True]
        (tmp_path / "de_DE-test-medium.onnx").unlink()
        await engine.refresh_voices()
        assert [v.id for v in engine.voices()] == ["en_US-joe-medium"]
        assert trims == [True]  # nothing loaded this time
    finally:
        await engine.stop()


async def speak(engine: PiperEngine, options: SynthesisOptions) -> np.ndarray:
    stream = engine.open_stream(engine.default_voice, options)
    audio = np.concatenate([pcm async for pcm in stream.synthesize(TEXT)])
    stream.close()
    return audio


async def test_speed_changes_the_duration(engine: PiperEngine) -> None:
    normal = await speak(engine, SynthesisOptions())
    fast = await speak(engine, SynthesisOptions(speed=2.0))
    low, high = SPEED_2_DURATION_RATIO
    assert low < fast.size / normal.size < high
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


async def test_a_silent_stream_hears_a_first_window_before_the_sentence_is_decoded(
    engine: PiperEngine,
) -> None:
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    chunks = [pcm.size async for pcm in stream.synthesize(TEXT)]
    stream.close()
    voice = engine._voice(engine.default_voice)
    # The window covers making the rest (on a fast machine, the least window); the rest came
    # after it.
    assert chunks[0] % voice.hop_samples == 0 and chunks[0] >= HEAD_FRAMES * voice.hop_samples
    assert len(chunks) >= 2 and sum(chunks[1:]) > chunks[0]


async def test_a_sentence_is_decoded_whole_while_its_listener_has_audio_enough(
    engine: PiperEngine,
) -> None:
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    assert isinstance(stream, _PiperStream)
    voice = engine._voice(engine.default_voice)
    (ids,) = voice.phoneme_ids(TEXT)
    latent = voice.sentence(ids, voice.scales(1.0))
    now_s = time.perf_counter()
    assert HEAD_FRAMES <= stream._head_frames(latent, runs_out_s=now_s) < voice.frames(latent)
    assert stream._head_frames(latent, runs_out_s=now_s + 60) == 0
    short = voice.sentence(voice.phoneme_ids("Hi.")[0], voice.scales(1.0))
    assert stream._head_frames(short, runs_out_s=now_s) == 0  # too short to gain anything
    stream.close()


async def make_rest(
    engine: PiperEngine, latent: Sentence, runs_out_in_s: float
) -> list[np.ndarray]:
    """The rest of ``latent`` after its first window, as a worker makes it for a listener who
    runs out of audio ``runs_out_in_s`` from now: the chunks posted, in order."""
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    assert isinstance(stream, _PiperStream) and engine._workers is not None
    job = piper_engine._Job(TEXT, PcmHandoff(), time.perf_counter() + runs_out_in_s, run_options())
    rest = functools.partial(stream._finish, job, latent, HEAD_FRAMES)
    engine._workers.submit(0.0, rest)
    chunks = [pcm async for pcm in job.handoff.chunks(StreamStats(), "Piper")]
    stream.close()
    return chunks


async def test_a_rest_taken_up_late_goes_out_as_a_window_first(engine: PiperEngine) -> None:
    """A rest whose listener runs out before it could be made whole: a first window of it is
    posted, the remainder after it, and together they are the rest made whole."""
    voice = engine._voice(engine.default_voice)
    (ids,) = voice.phoneme_ids(TEXT)
    latent = voice.sentence(ids, voice.scales(1.0))
    late = await make_rest(engine, latent, runs_out_in_s=0.0)
    assert late[0].size == HEAD_FRAMES * voice.hop_samples and len(late) >= 2
    whole = voice.scaled(voice.render(Sentence(latent.arrays), HEAD_FRAMES))
    assert matches(np.concatenate(late), whole)
    in_time = await make_rest(engine, Sentence(latent.arrays), runs_out_in_s=60.0)
    assert len(in_time) == 1 and matches(in_time[0], whole)


async def test_a_cancel_after_the_first_window_ends_the_piece(engine: PiperEngine) -> None:
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    received = []
    async for pcm in stream.synthesize(TEXT):
        received.append(pcm.size)
        stream.cancel()
    voice = engine._voice(engine.default_voice)
    assert len(received) == 1 and received[0] >= HEAD_FRAMES * voice.hop_samples
    assert stream.stats.segments == 0


async def test_audio_made_before_a_cancel_is_not_yielded_after_it(engine: PiperEngine) -> None:
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    assert isinstance(stream, _PiperStream)
    received = []
    async for pcm in stream.synthesize(TEXT):
        received.append(pcm.size)
        handoff = None if stream._job is None else stream._job.handoff
        assert handoff is not None
        deadline_s = time.monotonic() + 30
        while handoff._queue.qsize() < 2 and time.monotonic() < deadline_s:
            await asyncio.sleep(0.01)  # the rest and the end are posted, not yet taken
        assert handoff._queue.qsize() >= 2
        stream.cancel()
    assert len(received) == 1
    assert stream.stats.segments == 0


def count_starts(stream: _PiperStream) -> list[str]:
    """The pieces the stream's jobs start on, as they start (a spy on the worker call)."""
    started: list[str] = []
    start = stream._start

    def spy(job: Any) -> None:
        started.append(job.text)
        start(job)

    stream._start = spy  # type: ignore[method-assign]
    return started


async def test_a_prepared_segment_is_made_once_and_spoken_when_it_comes(
    engine: PiperEngine,
) -> None:
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    assert isinstance(stream, _PiperStream)
    started = count_starts(stream)
    stream.prepare(TEXT)
    stream.prepare(TEXT)  # the same hint again: nothing more
    audio = [pcm async for pcm in stream.synthesize(TEXT)]
    stream.close()
    assert started == [TEXT]  # the prepared job was the segment's job
    assert sum(pcm.size for pcm in audio) > engine.sample_rate  # all of it: over a second
    assert stream.stats.segments == 1


async def test_a_prepared_segment_that_does_not_come_is_dropped(engine: PiperEngine) -> None:
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    assert isinstance(stream, _PiperStream)
    started = count_starts(stream)
    stream.prepare(TEXT)
    prepared = stream._prepared
    assert prepared is not None
    other = "Something else entirely."
    audio = [pcm async for pcm in stream.synthesize(other)]
    assert prepared[1].stopped(stream._cancelled)  # dropped: nobody hears it
    assert started[-1] == other and TEXT in started
    # Only the other text was spoken: a short sentence, shorter than TEXT's nine words.
    assert 0 < sum(pcm.size for pcm in audio) < 2.2 * engine.sample_rate
    stream.prepare("And then this.")
    dropped = stream._prepared
    stream.close()  # a cancel drops a prepared job too
    assert dropped is not None and dropped[1].run_options.terminate  # its own runs stop
    assert stream._prepared is None


async def test_a_cancel_stops_the_runs_of_a_prepared_segment_being_spoken(
    engine: PiperEngine,
) -> None:
    """A prepared job runs with options of its own; barge-in must stop its runs too, or the
    rest of its sentence would hold a worker after the cancel."""
    stream = engine.open_stream(engine.default_voice, SynthesisOptions())
    assert isinstance(stream, _PiperStream)
    stream.prepare(TEXT)
    prepared = stream._prepared
    assert prepared is not None and not prepared[1].run_options.terminate
    async for _ in stream.synthesize(TEXT):
        stream.cancel()
    assert prepared[1].run_options.terminate
    stream.close()
