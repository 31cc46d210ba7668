"""Cloned voices in the Fish engine: upstream's prompt with a reference, its prefix prefilled
once and copied into later streams (same frames), references encoded off the event loop."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import numpy as np
import pytest
import torch

from streamtts.engine.base import ClonedVoice, SynthesisOptions
from streamtts.fish.engine import FishEngine, FishStream
from streamtts.fish.settings import FishSettings
from tests.audio_files import tone
from tests.fish_fixture import cached_index, entries, expected, fixture_dir, meta, require_dir
from tests.torch_guard import no_torch_on_this_thread

GREEDY = SynthesisOptions(top_p=1e-4, max_frames_per_segment=12)


def open_voice(
    engine: FishEngine, voice: ClonedVoice | None, options: SynthesisOptions = GREEDY
) -> FishStream:
    stream = engine.open_stream(voice or "default", options)
    assert isinstance(stream, FishStream)
    return stream


async def speak(stream: FishStream, text: str) -> np.ndarray:
    pieces = [pcm async for pcm in stream.synthesize(text)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


@pytest.fixture
async def fixture_engine() -> AsyncIterator[FishEngine]:
    engine = FishEngine(str(require_dir(fixture_dir())), FishSettings(dtype="fp32", max_streams=2))
    await engine.start()
    yield engine
    await engine.stop()


@pytest.mark.parametrize("entry", entries(r"prompt_ref\w*\.npy"))
async def test_the_engine_runs_upstreams_prompt_with_a_reference(
    fixture_engine: FishEngine, entry: str
) -> None:
    """The prompt the engine really prefills — the first stream computing the voice's prefix,
    the second copying it from the cache — is upstream's, and both generate the same frames."""
    directory = fixture_dir()
    index = cached_index(directory)
    info = meta(index, entry)
    want = expected(directory, index, entry)
    codes = expected(directory, index, "ref_codes.npy").astype(np.int32)
    voice = ClonedVoice("ref", info["ref_text"], codes)
    frames = []
    for _ in range(2):
        stream = open_voice(fixture_engine, voice)
        await speak(stream, info["text"])
        ran = stream.slot.conversation.cached_tokens
        assert ran is not None
        np.testing.assert_array_equal(ran[:, : want.shape[1]].numpy(), want)
        frames.append(stream.slot.conversation.history[1])
        stream.close()
    assert torch.equal(frames[0], frames[1])


async def test_a_voice_prefix_is_kept_forgotten_and_bounded() -> None:
    settings = FishSettings(dtype="fp32", max_streams=2, max_cached_voices=1)
    engine = FishEngine("synthetic:tiny", settings)
    await engine.start()
    try:
        codes = [np.full((8, 30), 5 + i, np.int32) for i in range(2)]
        voices = [ClonedVoice(f"v{i}", f"Reference number {i}.", c) for i, c in enumerate(codes)]

        async def frames_of(voice: ClonedVoice | None) -> torch.Tensor:
            stream = open_voice(engine, voice)
            await speak(stream, "Two words.")
            stream.close()
            return stream.slot.conversation.history[1]

        first = [await frames_of(v) for v in voices]  # v1 evicts v0 (capacity 1)
        again = [await frames_of(v) for v in voices]  # each prefilled again, or copied
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
        assert not torch.equal(first[0], first[1])  # the reference matters
        engine.forget_voice("v1")
        assert torch.equal(await frames_of(voices[1]), first[1])
        default = await frames_of(None)
        assert not torch.equal(default, first[0])
    finally:
        await engine.stop()


async def test_references_are_encoded_off_the_event_loop() -> None:
    engine = FishEngine("synthetic:tiny", FishSettings(dtype="fp32", max_streams=1))
    await engine.start()
    try:
        audio = tone(3.0, 22_050)
        with no_torch_on_this_thread():
            codes, _ = await asyncio.gather(
                engine.encode_reference(audio, 22_050), asyncio.sleep(0)
            )
        assert codes.dtype == np.int32 and codes.shape[0] == 8
        # 3 s at 44.1 kHz: 258 mel frames, halved twice (rounding up) by the downsampler: 65
        # codes, 21.5 per second.
        mel_frames = 3 * 44_100 // 512
        assert codes.shape[1] == math.ceil(math.ceil(mel_frames / 2) / 2) == 65
        assert int(codes.min()) >= 0 and int(codes.max()) < 1000
        assert engine.codec_id() == "synthetic:tiny:seed0"
        voice = ClonedVoice("mine", "A reference of three seconds.", codes)
        with no_torch_on_this_thread():
            stream = open_voice(engine, voice, SynthesisOptions())
            audio_out = await speak(stream, "It speaks now.")
            stream.close()
        assert audio_out.size == 3 * 9 * 2048
    finally:
        await engine.stop()
