"""The Fish streaming engine on ``synthetic:tiny``: batching, cancel, faults, first chunk."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import torch

from streamtts.config import Settings
from streamtts.engine.base import EngineError, OverloadedError, SynthesisOptions
from streamtts.fish.engine import FishEngine, FishSettings, FishStream, describe_dtype
from streamtts.fish.jobs import SegmentJob
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.tokenizer import FishTokenizer
from tests.fish_fixture import (
    cached_index,
    entries,
    expected,
    expected_turn,
    fixture_dir,
    generation_call,
    meta,
    require_dir,
    sibling,
)

GREEDY = SynthesisOptions(top_p=1e-4)  # keeps only the top token: sampling is an argmax
FRAME_SAMPLES = 2048
TEXTS = [
    "The first stream says something fairly short.",
    "A second stream, joining later, talks about trains and rivers and hills.",
    "Third one.",
]


@pytest.fixture
async def engine() -> AsyncIterator[FishEngine]:
    engine = FishEngine("synthetic:tiny", FishSettings(dtype="fp32", max_streams=4))
    await engine.start()
    yield engine
    await engine.stop()


def fish_stream(engine: FishEngine, options: SynthesisOptions = GREEDY) -> FishStream:
    stream = engine.open_stream("default", options)
    assert isinstance(stream, FishStream)
    return stream


async def speak(stream: FishStream, texts: list[str], delay_s: float = 0.0) -> np.ndarray:
    await asyncio.sleep(delay_s)
    pieces = [pcm for text in texts async for pcm in stream.synthesize(text)]
    return np.concatenate(pieces)


def frames_of(stream: FishStream) -> list[torch.Tensor]:
    """The generated frames of each segment (every other history entry)."""
    return stream.slot.history[1::2]


async def test_concurrent_streams_generate_what_each_would_alone(engine: FishEngine) -> None:
    alone = []
    for text in TEXTS:
        stream = fish_stream(engine)
        audio = await speak(stream, [text, "And a second segment."])
        alone.append((frames_of(stream), audio))
        stream.close()

    streams = [fish_stream(engine) for _ in TEXTS]
    together = await asyncio.gather(
        *(
            speak(s, [text, "And a second segment."], delay_s=0.03 * i)
            for i, (s, text) in enumerate(zip(streams, TEXTS, strict=True))
        )
    )
    for stream, audio, (frames_alone, audio_alone) in zip(streams, together, alone, strict=True):
        frames = frames_of(stream)
        assert len(frames) == len(frames_alone) == 2
        for got, want in zip(frames, frames_alone, strict=True):
            assert torch.equal(got, want)
        assert audio.shape == audio_alone.shape
        np.testing.assert_allclose(audio, audio_alone, atol=1e-4)
        stream.close()


async def test_synthetic_segments_last_as_long_as_speech(engine: FishEngine) -> None:
    stream = fish_stream(engine)
    audio = await speak(stream, ["one two three four five"])
    stream.close()
    assert audio.size == 5 * 9 * FRAME_SAMPLES  # 9 frames per word, prefill frame not vocoded


async def test_cancel_mid_stream_frees_the_slot_and_others_continue(engine: FishEngine) -> None:
    generator = engine.generator
    idle = generator.capacity
    assert generator.free_slots == idle  # the warm-up stream's slot is back
    long_options = SynthesisOptions(top_p=1e-4, max_frames_per_segment=400)
    victim = fish_stream(engine, long_options)
    other = fish_stream(engine)
    assert generator.free_slots == idle - 2

    async def cancel_after_first_audio() -> int:
        received = 0
        async for pcm in victim.synthesize(" ".join(["word"] * 60)):
            received += pcm.size
            victim.cancel()
        return received

    victim_samples, other_audio = await asyncio.gather(
        cancel_after_first_audio(), speak(other, ["The other stream keeps talking."])
    )
    assert 0 < victim_samples < 60 * 9 * FRAME_SAMPLES
    assert other_audio.size == 5 * 9 * FRAME_SAMPLES
    victim.close()
    assert generator.free_slots == idle - 1
    other.close()
    assert generator.free_slots == idle


async def test_all_slots_busy_is_overloaded_at_once(engine: FishEngine) -> None:
    streams = [fish_stream(engine) for _ in range(engine.generator.capacity)]
    started_s = time.perf_counter()
    with pytest.raises(OverloadedError):
        engine.open_stream("default", GREEDY)
    assert time.perf_counter() - started_s < 0.1
    for stream in streams:
        stream.close()


async def test_an_exception_in_one_job_fails_only_that_stream(engine: FishEngine) -> None:
    def inject(job: SegmentJob) -> None:
        if "explode" in job.text:
            raise RuntimeError("injected fault")

    engine.generator.before_job_work = inject
    bad, good = fish_stream(engine), fish_stream(engine)
    results = await asyncio.gather(
        speak(bad, ["please explode now"]),
        speak(good, ["This stream is fine."]),
        return_exceptions=True,
    )
    assert isinstance(results[0], EngineError)
    assert isinstance(results[1], np.ndarray) and results[1].size == 4 * 9 * FRAME_SAMPLES
    bad.close()
    good.close()
    # The engine keeps serving new streams.
    engine.generator.before_job_work = None
    after = fish_stream(engine)
    assert (await speak(after, ["Still working."])).size == 2 * 9 * FRAME_SAMPLES
    after.close()
    assert engine.healthy()


async def test_first_audio_comes_after_the_first_chunk_not_the_segment(
    engine: FishEngine,
) -> None:
    options = SynthesisOptions(top_p=1e-4, first_chunk_frames=3, chunk_frames=64)
    stream = fish_stream(engine, options)
    chunks = []
    async for pcm in stream.synthesize(" ".join(["word"] * 20)):  # 180 frames
        chunks.append(pcm.size)
    stream.close()
    assert chunks[0] == 3 * FRAME_SAMPLES
    assert sum(chunks) == 180 * FRAME_SAMPLES
    assert len(chunks) >= 3


async def test_invalid_sampling_options_are_refused(engine: FishEngine) -> None:
    with pytest.raises(EngineError) as info:
        engine.open_stream("default", SynthesisOptions(top_p=0.0))
    assert info.value.code == "invalid_field"


@pytest.mark.parametrize("entry", entries(r"gen_\w+?_fp32_y\.npy"))
async def test_a_checkpoint_directory_streams_what_upstream_generates(entry: str) -> None:
    """The whole engine (shared-prefix KV copy, chunked prefill, batched decode, chunked
    incremental vocoding) on the upstream-format fixture checkpoint reproduces upstream's
    fp32 generation of every case and its one-shot vocoder output."""
    directory = require_dir(fixture_dir())
    index = cached_index(directory)
    info = meta(index, entry)
    want_frames = expected(directory, index, sibling(entry, "y", "frames"))
    want_audio = expected(directory, index, sibling(entry, "y", "audio"))
    call = generation_call(index, entry)
    engine = FishEngine(str(directory), FishSettings(dtype="fp32", max_streams=2))
    await engine.start()
    try:
        options = SynthesisOptions(
            top_p=call["top_p"],
            temperature=call["temperature"],
            repetition_penalty=call["repetition_penalty"],
            max_frames_per_segment=call["max_new_tokens"],
        )
        stream = fish_stream(engine, options)
        audio = await speak(stream, [call["text"]])
        frames = frames_of(stream)[0]
        stream.close()
    finally:
        await engine.stop()
    assert frames.shape[1] == info["n_generated"]
    np.testing.assert_array_equal(frames.numpy(), want_frames)
    assert audio.shape == want_audio.shape
    np.testing.assert_allclose(audio, want_audio, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("text", "piece"),
    [("😀 Hello there.", "Hello there."), ("Hello there. 😀", "Hello there.")],
)
async def test_the_engine_runs_upstreams_prompt_for_emoji_texts(text: str, piece: str) -> None:
    """The prompt the engine really prefills (its slot's tokens) is upstream's: no space token
    left where a deleted emoji stood at either end of the text."""
    directory = require_dir(fixture_dir())
    engine = FishEngine(str(directory), FishSettings(dtype="fp32", max_streams=1))
    await engine.start()
    try:
        stream = fish_stream(engine, SynthesisOptions(top_p=1e-4, max_frames_per_segment=4))
        await speak(stream, [text])
        turn = stream.slot.history[0]  # [C+1, n]
        ran = stream.slot.cached_tokens
        stream.close()
        builder = PromptBuilder(FishTokenizer.from_file(directory / "tokenizer.tiktoken"), 8)
    finally:
        await engine.stop()
    assert turn[0].tolist() == expected_turn(builder.tokenizer, piece)
    prompt = torch.cat([builder.prefix(), turn], dim=1)
    assert torch.equal(ran[:, : prompt.shape[1]], prompt)


async def test_a_segment_with_nothing_to_say_is_silent_not_an_error(engine: FishEngine) -> None:
    stream = fish_stream(engine)
    assert [pcm async for pcm in stream.synthesize("😀 🚀")] == []
    assert stream.slot.history == []  # no prompt was built
    audio = await speak(stream, ["two words"])  # the stream carries on
    stream.close()
    assert audio.size == 2 * 9 * FRAME_SAMPLES


async def test_int8_weights_serve_the_same_interface() -> None:
    engine = FishEngine("synthetic:tiny", FishSettings(dtype="int8", max_streams=1))
    await engine.start()
    try:
        assert describe_dtype(engine.generator.model) == "int8+bfloat16"
        stream = fish_stream(engine)
        audio = await speak(stream, ["two words"])
        stream.close()
    finally:
        await engine.stop()
    assert audio.size == 2 * 9 * FRAME_SAMPLES


async def test_a_long_conversation_in_one_stream_keeps_speaking(engine: FishEngine) -> None:
    """Many segments in one stream: the iterative-prompt history is trimmed to fit the cache
    (synthetic:tiny has 1024 positions) and every segment still gets its full audio."""
    stream = fish_stream(engine)
    sentence = "this sentence has exactly eight words in it"
    for _ in range(12):  # 12 x (about 20 prompt tokens + 73 frames) > 1024 positions
        audio = await speak(stream, [sentence])
        assert audio.size == 8 * 9 * FRAME_SAMPLES
    assert stream.slot.cached_tokens.shape[1] < 1024
    stream.close()


async def test_a_compiled_codebook_pass_generates_what_eager_does() -> None:
    """``compile``: the codebook pass compiled per batch bucket (1 and 2 here); greedy frames of
    two concurrent streams (bucket 2) and one alone (bucket 1) equal the eager engine's."""
    texts = ["a compiled graph speaks", "and so does a second stream here"]

    async def frames(settings: FishSettings) -> list[torch.Tensor]:
        engine = FishEngine("synthetic:tiny", settings)
        await engine.start()
        try:
            streams = [fish_stream(engine) for _ in texts]
            await asyncio.gather(*(speak(s, [t]) for s, t in zip(streams, texts, strict=True)))
            out = [frames_of(s)[0] for s in streams]
            for s in streams:
                s.close()
            alone = fish_stream(engine)
            await speak(alone, ["alone now"])
            out.append(frames_of(alone)[0])
            alone.close()
            if settings.compile:
                # fp32: the slow step stays eager (compiled only for int8 on the CPU).
                assert sorted(engine.generator.compile_s) == ["codebook_b1", "codebook_b2"]
            return out
        finally:
            await engine.stop()

    eager = await frames(FishSettings(dtype="fp32", max_streams=2))
    compiled = await frames(FishSettings(dtype="fp32", max_streams=2, compile=True))
    for want, got in zip(eager, compiled, strict=True):
        assert torch.equal(want, got)


async def test_cpu_engine_runs_all_torch_work_on_one_thread(engine: FishEngine) -> None:
    """On the CPU the vocoder is inline on the generator thread (see engine.devices)."""
    names = {t.name for t in threading.enumerate()}
    assert "generator" in names and "vocoder" not in names and "fish-load" not in names
    stream = fish_stream(engine)
    audio = await speak(stream, ["Inline vocoder."])
    stream.close()
    assert audio.size > 0 and audio.size % FRAME_SAMPLES == 0
    assert engine.healthy()


async def test_generator_call_runs_between_iterations_on_its_thread(engine: FishEngine) -> None:
    where = await asyncio.wrap_future(
        engine.generator.call(lambda: threading.current_thread().name)
    )
    assert where == "generator"

    def broken() -> None:
        raise ValueError("bench bug")

    with pytest.raises(ValueError, match="bench bug"):
        await asyncio.wrap_future(engine.generator.call(broken))
    assert engine.healthy()  # the caller's error does not kill the worker


def test_engine_defaults_are_the_server_defaults() -> None:
    """The server fills FishSettings from Settings field by field (engine.factory); direct
    users (bench, engine bench) get FishSettings' own defaults, which must be the same."""
    server = Settings()
    for field in dataclasses.fields(FishSettings):
        assert getattr(FishSettings(), field.name) == getattr(server, field.name), field.name
