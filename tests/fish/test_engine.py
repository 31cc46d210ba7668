"""The Fish streaming engine on ``synthetic:tiny``: batching, cancel, faults, first chunk."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import torch

from streamtts.engine.base import (
    ClonedVoice,
    EngineStream,
    InvalidOptionError,
    OverloadedError,
    SynthesisError,
    SynthesisOptions,
)
from streamtts.fish import compiled as compiled_passes
from streamtts.fish import devices, load
from streamtts.fish.devices import choose_dtype
from streamtts.fish.engine import FishEngine, FishStream
from streamtts.fish.generator import GeneratorWorker
from streamtts.fish.jobs import SegmentJob
from streamtts.fish.settings import FishSettings
from streamtts.models.fish.fused.slow_step import FusedSlowStep
from streamtts.models.fish.llm.generate import fast_codes, slow_step
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.tokenizer import FishTokenizer
from streamtts.models.fish.packed import is_packed, packs, packs_fp32
from streamtts.options import OptionError
from streamtts.scheduling import CostModel, SchedulingSettings
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
from tests.torch_guard import TorchOnThisThread, no_torch_on_this_thread

GREEDY = SynthesisOptions(top_p=1e-4)  # keeps only the top token: sampling is an argmax
FRAME_SAMPLES = 2048
TEXTS = [
    "The first stream says something fairly short.",
    "A second stream, joining later, talks about trains and rivers and hills.",
    "Third one.",
]


def explode(job: SegmentJob) -> None:
    """The engines' job hook here: a segment saying "explode" fails inside the generator."""
    if "explode" in job.text:
        raise RuntimeError("injected fault")


@pytest.fixture
async def engine() -> AsyncIterator[FishEngine]:
    settings = FishSettings(dtype="fp32", max_streams=4)
    engine = FishEngine("synthetic:tiny", settings, job_hook=explode)
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
    return stream.slot.conversation.history[1::2]


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
    idle = engine.capacity().streams
    assert idle is not None and engine.capacity().free == idle  # the warm-up slot is back
    long_options = SynthesisOptions(top_p=1e-4, max_frames_per_segment=400)
    victim = fish_stream(engine, long_options)
    other = fish_stream(engine)
    assert engine.capacity().free == idle - 2

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
    assert engine.capacity().free == idle - 1
    other.close()
    assert engine.capacity().free == idle


async def test_all_slots_busy_is_overloaded_at_once(engine: FishEngine) -> None:
    streams = [fish_stream(engine) for _ in range(engine.capacity().streams or 0)]
    assert len(streams) == 4
    started_s = time.perf_counter()
    with pytest.raises(OverloadedError):
        engine.open_stream("default", GREEDY)
    assert time.perf_counter() - started_s < 0.1
    for stream in streams:
        stream.close()


async def test_an_exception_in_one_job_fails_only_that_stream(engine: FishEngine) -> None:
    bad, good = fish_stream(engine), fish_stream(engine)
    results = await asyncio.gather(
        speak(bad, ["please explode now"]),
        speak(good, ["This stream is fine."]),
        return_exceptions=True,
    )
    assert isinstance(results[0], SynthesisError)
    assert isinstance(results[1], np.ndarray) and results[1].size == 4 * 9 * FRAME_SAMPLES
    bad.close()
    good.close()
    # The engine keeps serving new streams.
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


@pytest.mark.parametrize(
    ("measured_cost", "first_frames"), [(None, 1), (0.1, 1), (0.79, 1), (0.9, 2), (1.5, 1)]
)
async def test_the_automatic_first_chunk_follows_the_measured_cost(
    engine: FishEngine,
    monkeypatch: pytest.MonkeyPatch,
    measured_cost: float | None,
    first_frames: int,
) -> None:
    """One frame, or two while the engine's measured cost (compute s per audio s, at the
    stream's batch size) is 0.8-1x real time. The cost is set here: the tiny model's own,
    vocoder included, comes out near real time on a slow or busy machine."""
    monkeypatch.setattr(CostModel, "cost", lambda _self, _batch: measured_cost)
    stream = fish_stream(engine, SynthesisOptions(top_p=1e-4))
    chunks = [pcm.size async for pcm in stream.synthesize("word word word word")]  # 36 frames
    stream.close()
    assert chunks[0] == first_frames * FRAME_SAMPLES
    assert sum(chunks) == 36 * FRAME_SAMPLES


@pytest.mark.parametrize(
    ("cost_of_one", "admit_by_capacity", "full_batch_measured"),
    [(0.5, True, True), (0.7, True, False), (0.7, False, True)],
)
async def test_the_warm_up_measures_a_full_batch_unless_admission_keeps_to_one_stream(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cost_of_one: float,
    admit_by_capacity: bool,
    full_batch_measured: bool,
) -> None:
    """With the default headroom (0.4) admission allows a second stream only where one costs
    at most 0.6 s per audio second; above that, and with admission by capacity, the full
    batch's warm-up would be measured for nothing. The cost is set here (see above)."""
    monkeypatch.setattr(CostModel, "cost", lambda _self, _batch: cost_of_one)
    caplog.set_level(logging.INFO, logger="streamtts.fish.engine")
    opened: list[str | ClonedVoice] = []
    open_stream = FishEngine.open_stream

    def counted(
        self: FishEngine, voice: str | ClonedVoice, options: SynthesisOptions
    ) -> EngineStream:
        opened.append(voice)
        return open_stream(self, voice, options)

    monkeypatch.setattr(FishEngine, "open_stream", counted)
    scheduling = SchedulingSettings(admit_by_capacity=admit_by_capacity)
    engine = FishEngine("synthetic:tiny", FishSettings(max_streams=2), scheduling)
    await engine.start()
    try:
        # One stream, then both slots at once (whose steps are not all of two streams: they
        # start out of step while one prefills).
        assert len(opened) == (3 if full_batch_measured else 1)
        assert ("a full batch is not measured" in caplog.text) != full_batch_measured
        await says_two_words(engine)
    finally:
        await engine.stop()


async def test_options_fish_cannot_honour_are_refused_at_open(engine: FishEngine) -> None:
    with pytest.raises(OptionError, match="top_p"):
        SynthesisOptions(top_p=0.0)  # out of range: never reaches an engine
    with pytest.raises(InvalidOptionError, match="'speed' is not supported") as info:
        engine.open_stream("default", SynthesisOptions(speed=2.0))
    assert info.value.option == "speed"
    assert engine.capacity().free == engine.capacity().streams  # nothing was taken


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
        turn = stream.slot.conversation.history[0]  # [C+1, n]
        ran = stream.slot.conversation.cached_tokens
        assert ran is not None
        stream.close()
        builder = PromptBuilder(FishTokenizer.from_file(directory / "tokenizer.tiktoken"), 8)
    finally:
        await engine.stop()
    assert turn[0].tolist() == expected_turn(builder.tokenizer, piece)
    prompt = torch.cat([builder.prefix(), turn], dim=1)
    assert torch.equal(ran[:, : prompt.shape[1]], prompt)


async def test_a_first_segment_prefills_from_its_text(
    engine: FishEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The voice keeps its prefix's keys/values and those of the opening every turn begins
    with (streamtts.fish.prefixes): a stream's first segment prefills from its text on; a
    later one from what the slot does not hold yet."""
    planned: list[tuple[int, torch.Tensor]] = []  # where each prefill starts, in which prompt
    plan = GeneratorWorker._plan

    def recorded(self: GeneratorWorker, job: SegmentJob) -> None:
        plan(self, job)
        assert job.prompt is not None
        planned.append((job.prefill_pos, job.prompt))

    monkeypatch.setattr(GeneratorWorker, "_plan", recorded)
    stream = fish_stream(engine)
    await speak(stream, ["two words"])
    await speak(stream, ["three more words"])
    stream.close()
    builder = engine._ready().generator._prompts
    kept = torch.cat([builder.prefix(), builder.turn_opening()], dim=1)
    (first_from, first), (second_from, _) = planned
    assert torch.equal(first[:, : kept.shape[1]], kept) and first_from == kept.shape[1]
    assert second_from > first.shape[1]


async def test_a_segment_with_nothing_to_say_is_silent_not_an_error(engine: FishEngine) -> None:
    stream = fish_stream(engine)
    assert [pcm async for pcm in stream.synthesize("😀 🚀")] == []
    assert stream.slot.conversation.history == []  # no prompt was built
    audio = await speak(stream, ["two words"])  # the stream carries on
    stream.close()
    assert audio.size == 2 * 9 * FRAME_SAMPLES


async def test_int8_weights_serve_the_same_interface() -> None:
    """int8 layers computing in what ``auto`` picks here (bf16 where the CPU has it), with a
    packed vocoder in that dtype (fp32 too: int8 is not the parity mode)."""
    engine = FishEngine("synthetic:tiny", FishSettings(dtype="int8", max_streams=1))
    await engine.start()
    try:
        cpu = torch.device("cpu")
        dtype = choose_dtype("auto", cpu)
        computes_in = str(dtype).removeprefix("torch.")
        assert engine.describe()["dtype"] == f"int8+{computes_in}"
        vocoder_packed = await engine.profile(lambda passes: passes.decoder.packed)
        assert vocoder_packed is (packs(cpu, dtype) or packs_fp32(cpu, dtype))
        await says_two_words(engine)
    finally:
        await engine.stop()


async def says_two_words(engine: FishEngine) -> None:
    """A stream says "two words": nine frames of synthetic speech a word."""
    stream = fish_stream(engine)
    audio = await speak(stream, ["two words"])
    stream.close()
    assert audio.size == 2 * 9 * FRAME_SAMPLES


async def test_explicit_fp32_keeps_upstreams_vocoder_kernels(engine: FishEngine) -> None:
    """``fp32`` is the parity mode: its vocoder is not packed (``auto``'s fp32 is)."""
    assert not await engine.profile(lambda passes: passes.decoder.packed)


async def test_a_long_conversation_in_one_stream_keeps_speaking(engine: FishEngine) -> None:
    """Many segments in one stream: the iterative-prompt history is trimmed to fit the cache
    (synthetic:tiny has 1024 positions) and every segment still gets its full audio."""
    stream = fish_stream(engine)
    sentence = "this sentence has exactly eight words in it"
    for _ in range(12):  # 12 x (about 20 prompt tokens + 73 frames) > 1024 positions
        audio = await speak(stream, [sentence])
        assert audio.size == 8 * 9 * FRAME_SAMPLES
    cached = stream.slot.conversation.cached_tokens
    assert cached is not None and cached.shape[1] < 1024
    stream.close()


SAMPLED = {"temperature": 0.9, "top_p": 0.9}  # real sampling: the draws matter
SEEDED_TEXTS = ["A seeded stream says this.", "Then this, in the same voice."]


async def seeded_frames(engine: FishEngine, seed: int | None) -> list[torch.Tensor]:
    stream = fish_stream(engine, SynthesisOptions(seed=seed, **SAMPLED))
    await speak(stream, SEEDED_TEXTS)
    stream.close()
    return frames_of(stream)


async def test_a_seed_makes_a_stream_reproducible(engine: FishEngine) -> None:
    first, again, other = [await seeded_frames(engine, s) for s in (11, 11, 12)]
    assert len(first) == len(SEEDED_TEXTS)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    unseeded = [await seeded_frames(engine, None) for _ in range(2)]
    assert not torch.equal(unseeded[0][0], unseeded[1][0])  # sampling is really random


async def test_a_seeded_stream_in_a_batch_draws_what_it_draws_alone(engine: FishEngine) -> None:
    """Its draws come from its own generator, whatever else shares its decode steps (in fp32
    the batched arithmetic is the single stream's too, so its frames are the same)."""
    alone = await seeded_frames(engine, seed=7)
    crowd = [fish_stream(engine, SynthesisOptions(**SAMPLED)) for _ in range(2)]
    together, *_ = await asyncio.gather(
        seeded_frames(engine, seed=7),
        *(
            speak(c, ["Others talk at the same time.", "And go on."], 0.02 * i)
            for i, c in enumerate(crowd)
        ),
    )
    for c in crowd:
        c.close()
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))


async def test_a_compiled_codebook_pass_generates_what_eager_does() -> None:
    """``compile``: the codebook pass compiled per batch bucket (1 and 2 here); greedy frames of
    two concurrent streams (bucket 2) and one alone (bucket 1) equal the eager engine's, and a
    seeded stream says the same twice in the compiled engine too (its draws are inputs)."""
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
            seeded = [await seeded_frames(engine, seed=21) for _ in range(2)]
            assert all(torch.equal(a, b) for a, b in zip(*seeded, strict=True))
            if settings.compile:
                # fp32: the slow step stays eager (compiled only for int8 on the CPU).
                assert sorted(engine.describe()["compile_s"]) == ["codebook_b1", "codebook_b2"]
            return out
        finally:
            await engine.stop()

    eager = await frames(FishSettings(dtype="fp32", max_streams=2))
    compiled = await frames(FishSettings(dtype="fp32", max_streams=2, compile=True))
    for want, got in zip(eager, compiled, strict=True):
        assert torch.equal(want, got)


async def test_compile_keeps_a_packed_fp32_pass_packed_and_speaks_as_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``compile`` with ``auto`` on a CPU without native bf16 (fp32, packed): the codebook pass
    and the slow step are compiled around their packed layers, which stay packed, and kept
    graphs (their timing against eager stubbed as faster here; the choice itself:
    tests/fish/test_compiled.py) say what the eager engine says for a seeded stream."""
    monkeypatch.setattr(devices, "_cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(compiled_passes, "compare_ms", lambda *_: (1.0, 2.0))

    async def frames(settings: FishSettings) -> list[torch.Tensor]:
        engine = FishEngine("synthetic:tiny", settings)
        await engine.start()
        try:
            info = engine.describe()
            assert info["dtype"] == "float32"
            assert await engine.profile(lambda passes: is_packed(passes.model.fast_layers))
            if settings.compile:
                assert sorted(info["compile_s"]) == ["codebook_b1", "slow_b1"]
                assert info["compiled_but_eager"] == []
                assert await engine.profile(lambda passes: passes.fast is not fast_codes)
                assert await engine.profile(lambda passes: passes.slow is not slow_step)
            return await seeded_frames(engine, seed=5)
        finally:
            await engine.stop()

    eager = await frames(FishSettings(max_streams=1))
    compiled_frames = await frames(FishSettings(max_streams=1, compile=True))
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled_frames, strict=True))


async def test_the_fused_ops_speak_as_the_python_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``dtype auto`` on the CPU the layers are packed and the engine runs the fused ops
    (:mod:`streamtts.models.fish.fused`, bit for bit the Python code): seeded streams, alone
    and two at once, say what they say with ``fused_ops`` off. Both on oneDNN's layers: with
    the fused ops on, layers would otherwise be paired on an AVX512-BF16 CPU, whose sums
    differ from oneDNN's by roundings (paired, the op and the Python pass agree bit for bit:
    ``tests/models/fish/fused/test_codebook_pass.py``). The prompts are prefilled by the fused
    prefill where the slow step is fused."""
    monkeypatch.setattr(load, "why_not_paired", lambda: "kept on oneDNN in this test")
    fused_prefills = 0
    fused_prefill = FusedSlowStep.prefill

    def counted(self: FusedSlowStep, *args: Any, **kwargs: Any) -> Any:
        nonlocal fused_prefills
        fused_prefills += 1
        return fused_prefill(self, *args, **kwargs)

    monkeypatch.setattr(FusedSlowStep, "prefill", counted)

    async def frames(settings: FishSettings) -> tuple[list[str], list[torch.Tensor]]:
        engine = FishEngine("synthetic:tiny", settings)
        await engine.start()
        try:
            alone = await seeded_frames(engine, seed=5)
            together = await asyncio.gather(*(seeded_frames(engine, seed=s) for s in (6, 7)))
            info = engine.describe()
            assert info["fast_products"] == info["slow_products"] == "onednn"
            return [info["codebook_pass"], info["slow_step"]], [
                *alone,
                *together[0],
                *together[1],
            ]
        finally:
            await engine.stop()

    fused_what, fused_frames = await frames(FishSettings(max_streams=2))
    # the default voice's prefix at start, then each of the three segments' prompts
    assert fused_prefills >= 4
    fused_prefills = 0
    python_what, python_frames = await frames(FishSettings(max_streams=2, fused_ops=False))
    assert fused_prefills == 0
    assert fused_what == ["fused", "fused"]
    assert python_what == ["python (fused_ops is off)"] * 2
    assert all(torch.equal(a, b) for a, b in zip(fused_frames, python_frames, strict=True))


async def test_the_parity_mode_keeps_the_python_code(engine: FishEngine) -> None:
    """Explicit fp32 packs nothing, so the fused ops (packed layers only) do not apply."""
    info = engine.describe()
    unfused = "python (the gate and up projections are not fused)"
    assert info["codebook_pass"] == info["slow_step"] == unfused


async def test_cpu_engine_runs_all_torch_work_on_one_thread(engine: FishEngine) -> None:
    """On the CPU the vocoder is inline on the generator thread (see engine.devices)."""
    names = {t.name for t in threading.enumerate()}
    assert "generator" in names and "vocoder" not in names and "fish-load" not in names
    stream = fish_stream(engine)
    audio = await speak(stream, ["Inline vocoder."])
    stream.close()
    assert audio.size > 0 and audio.size % FRAME_SAMPLES == 0
    assert engine.healthy()


async def test_no_torch_runs_on_the_event_loop(engine: FishEngine) -> None:
    """Every loop-side call of a stream's life (open, synthesize, cancel, close) and of the
    engine (capacity, voices, describe) leaves all torch work to the workers: on CUDA a tensor
    made on the loop thread would land on its stream, unordered with the workers'."""
    with no_torch_on_this_thread(), pytest.raises(TorchOnThisThread):
        torch.zeros(1)  # the guard works
    with no_torch_on_this_thread():
        seeded = fish_stream(engine, SynthesisOptions(seed=5, temperature=0.9, top_p=0.9))
        audio = await speak(seeded, ["A stream that speaks twice.", "And once more."])
        seeded.close()
        victim = fish_stream(engine, SynthesisOptions(max_frames_per_segment=400))
        async for _ in victim.synthesize(" ".join(["word"] * 30)):
            victim.cancel()
        victim.close()
        assert engine.capacity().free == engine.capacity().streams
        assert engine.voices() and engine.describe()["engine"] == "fish"
    assert audio.size == 8 * 9 * FRAME_SAMPLES


async def test_profile_runs_on_the_model_thread(engine: FishEngine) -> None:
    where = await engine.profile(lambda passes: (threading.current_thread().name, passes))
    assert where[0] == "generator"
    assert where[1].model.config.num_codebooks == 8

    def broken(_: object) -> None:
        raise ValueError("bench bug")

    with pytest.raises(ValueError, match="bench bug"):
        await engine.profile(broken)
    assert engine.healthy()  # the caller's error does not kill the worker


async def parked(job: SegmentJob, timeout_s: float = 30.0) -> None:
    """Wait until a prepared job has made its first chunk's frames and waits."""
    give_up_s = time.perf_counter() + timeout_s
    while not job.parked:
        assert time.perf_counter() < give_up_s, "the prepared segment never got its first chunk"
        await asyncio.sleep(0.01)


def prepared_job(stream: FishStream) -> SegmentJob:
    assert stream._prepared is not None
    return stream._prepared[1]


async def test_a_prepared_segment_waits_unheard_and_is_spoken_when_it_comes(
    engine: FishEngine,
) -> None:
    text = TEXTS[0]
    plain = fish_stream(engine)
    want_audio = await speak(plain, [text])
    want_frames = frames_of(plain)
    plain.close()

    stream = fish_stream(engine)
    generator = engine._ready().generator
    jobs: list[SegmentJob] = []

    def seen(job: SegmentJob) -> None:
        if job not in jobs:
            jobs.append(job)

    generator.before_job_work = seen
    stream.prepare(text)
    stream.prepare(text)  # the same hint again: nothing more
    job = prepared_job(stream)
    await parked(job)
    # Parked: its first chunk is made, nothing reached the vocoder, and the generator neither
    # decodes it further nor spins while it waits.
    iterations = 0
    drain = generator._after_iteration  # the inline vocoder's

    def count() -> None:
        nonlocal iterations
        iterations += 1
        drain()

    generator._after_iteration = count
    await asyncio.sleep(0.3)
    generator._after_iteration = drain
    assert len(job.frames) == 1 + job.schedule.first_frames
    assert job.sent_frames == 0 and stream._prepared is not None
    assert stream._prepared[2]._queue.empty()
    assert iterations <= 1
    audio = await speak(stream, [text])
    assert jobs == [job]  # the prepared job was the segment's job
    assert all(torch.equal(a, b) for a, b in zip(frames_of(stream), want_frames, strict=True))
    assert audio.shape == want_audio.shape
    np.testing.assert_allclose(audio, want_audio, atol=1e-4)
    stream.close()


@pytest.mark.parametrize("before", [[], ["A first segment, spoken."]])
async def test_a_prepared_segment_that_does_not_come_leaves_no_trace(
    engine: FishEngine, before: list[str]
) -> None:
    """The conversation is rewound: what the stream says next is what it would have said."""
    texts = [*before, "What really comes next."]
    plain = fish_stream(engine)
    want_audio = await speak(plain, texts)
    want_frames = frames_of(plain)
    plain.close()

    stream = fish_stream(engine)
    idle_free = engine.capacity().free
    parts = [await speak(stream, before)] if before else []
    stream.prepare("A sentence that never comes.")
    await parked(prepared_job(stream))
    stream.prepare("Nor does this one.")  # replaces the first hint
    await parked(prepared_job(stream))
    parts.append(await speak(stream, texts[-1:]))
    assert stream._prepared is None
    frames = frames_of(stream)
    assert len(frames) == len(want_frames)
    assert all(torch.equal(a, b) for a, b in zip(frames, want_frames, strict=True))
    np.testing.assert_allclose(np.concatenate(parts), want_audio, atol=1e-4)
    stream.prepare("Left prepared at close.")
    stream.close()
    assert engine.capacity().free == idle_free + 1


async def test_a_seeded_stream_prepares_nothing(engine: FishEngine) -> None:
    stream = fish_stream(engine, SynthesisOptions(**SAMPLED, seed=3))
    stream.prepare("Its audio must not depend on timing.")
    assert stream._prepared is None
    stream.close()


async def test_a_cancel_drops_a_prepared_segment(engine: FishEngine) -> None:
    stream = fish_stream(engine)
    stream.prepare(TEXTS[1])
    job = prepared_job(stream)
    stream.cancel()
    assert stream._prepared is None
    assert [pcm async for pcm in stream.synthesize(TEXTS[1])] == []
    stream.close()
    assert job.sent_frames == 0


async def test_a_prepared_segment_that_fails_fails_when_it_comes(engine: FishEngine) -> None:
    stream = fish_stream(engine)
    stream.prepare("please explode now")
    job = prepared_job(stream)
    give_up_s = time.perf_counter() + 30
    while not job.dropped:  # the hook raised in the generator
        assert time.perf_counter() < give_up_s
        await asyncio.sleep(0.01)
    with pytest.raises(SynthesisError):
        await speak(stream, ["please explode now"])
    stream.close()
    other = fish_stream(engine)
    assert (await speak(other, ["Still working."])).size == 2 * 9 * FRAME_SAMPLES
    other.close()
    assert engine.healthy()
