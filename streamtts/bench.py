"""``streamtts bench``: per-stage figures of the Fish engine against this machine's limits.

Stages: prefill (64 and 256 tokens), the slow transformer step and the fast (codebook)
transformer at batch 1/4/16, the vocoder's real-time factor, and end to end through the engine:
frames per second at batch 1, time to first audio, and how far generator and vocoder overlap.
The stages run on the engine's model thread through :meth:`FishEngine.profile`; end to end
uses the engine's public API. The roofline: the bytes of weights a
decode step must read (slow layers and head once, fast layers once per codebook position)
divided by this machine's measured memory bandwidth, against the measured step time — for the
whole step, the slow step and the codebook pass each (``*_roofline_fraction``), each time paired
with the bandwidth measured just before it (:func:`batch1_rounds`). First audio is
also given in decode steps of one stream (``ttfa_steps``), and with ``--first-chunk-frames``
for other first chunks in the same run; ``--profile`` adds the codebook pass op by op.
"""

from __future__ import annotations

import asyncio
import dataclasses
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from streamtts import hugepages
from streamtts.engine.base import SynthesisOptions
from streamtts.fish.devices import choose_device
from streamtts.fish.engine import FishEngine, ModelPasses
from streamtts.fish.generator import UPSTREAM_DRAWS
from streamtts.fish.settings import FishSettings
from streamtts.models.fish.codec.incremental import IncrementalDecoder
from streamtts.models.fish.llm.generate import (
    RepetitionWindows,
    decode_step,
    frame_noise,
    sample_frame,
)
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams
from streamtts.models.fish.packed import PackedLinear
from streamtts.opprofile import op_profile, start_profiler_here

SENTENCE_60_CHARS = "The weather is lovely today, so let us walk down to the sea."
BANDWIDTH_BYTES = 1 << 30
BANDWIDTH_PASSES = 3  # sums per bandwidth measurement (the fastest counts)
# Batch-1 rounds, each timing the stages right after measuring the bandwidth (see batch1_rounds)
ROOFLINE_ROUNDS = 5
KV_POSITION = 256  # decode steps are timed with this many cached positions
LONG_KV_POSITION = 2048  # ... and the slow step once more, as deep into a conversation


@dataclass(frozen=True)
class BenchOptions:
    model: str = "synthetic:1.5"
    device: str = "auto"
    dtype: str = "auto"
    repeats: int = 5
    batches: tuple[int, ...] = (1, 4, 16)
    compile: bool = False
    op_profile: bool = False  # also profile the codebook pass op by op (streamtts.opprofile)
    # TTFA also with these first chunks (frames), in the same run as the default's
    first_chunk_frames: tuple[int, ...] = ()


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timings_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> list[float]:
    """``fn``'s wall time in ms, ``repeats`` times after a warm-up."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync(device)
        started_s = time.perf_counter()
        fn()
        _sync(device)
        times.append(1000.0 * (time.perf_counter() - started_s))
    return times


def median_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    return statistics.median(timings_ms(fn, repeats, device))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_bandwidth_gb_s(device: torch.device) -> float:
    """Read bandwidth: summing a 1 GiB tensor, far beyond any cache, the fastest of 3 passes.

    The fastest, not the median: a roofline is what the memory can deliver, and on a shared
    host a slower pass is another tenant's doing (a median let a step's fraction exceed 1).
    """
    x = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32, device=device)
    fastest_ms = min(timings_ms(lambda: x.sum(), BANDWIDTH_PASSES, device))
    return BANDWIDTH_BYTES / (fastest_ms / 1000) / 1e9


@dataclass(frozen=True)
class RooflineStage:
    """A batch-1 stage set against the roofline: its time figure, its fraction figure, and the
    part of :func:`weight_bytes_per_step` it reads."""

    time_figure: str
    fraction_figure: str
    weights: str


ROOFLINE_STAGES = (
    RooflineStage("slow_step_ms_b1", "slow_step_roofline_fraction", "slow"),
    RooflineStage("fast_ms_b1", "codebook_pass_roofline_fraction", "fast"),
    RooflineStage("step_ms_b1", "roofline_fraction", "total"),
)


def batch1_rounds(
    stages: StageBench, weights: dict[str, int], rounds: int = ROOFLINE_ROUNDS
) -> dict[str, Any]:
    """The batch-1 stages against the memory roofline, in ``rounds`` rounds.

    Each round measures the bandwidth before and after timing the slow step, the codebook pass
    and the whole step, and sets each stage against the higher of the two, so each roofline
    fraction (weight bytes / that bandwidth, over the stage's time) pairs measurements seconds
    apart: this shared host's bandwidth swings 2x within minutes, which a single bandwidth
    figure set against stage times taken a minute earlier turns into noise. Times, bandwidth
    and fractions are medians over the rounds; each fraction's range over the rounds too.
    """
    timers: dict[str, Callable[[int], float]] = {
        "slow_step_ms_b1": stages.slow_step_ms,
        "fast_ms_b1": stages.fast_ms,
        "step_ms_b1": stages.step_ms,
    }
    bandwidths: list[float] = []
    times: dict[str, list[float]] = {stage.time_figure: [] for stage in ROOFLINE_STAGES}
    fractions: dict[str, list[float]] = {stage.fraction_figure: [] for stage in ROOFLINE_STAGES}
    for done in range(rounds):
        progress(f"  batch 1, round {done + 1}/{rounds}: bandwidth, slow step, codebook pass, step")
        before_gb_s = memory_bandwidth_gb_s(stages.device)
        round_ms = {stage: timers[stage.time_figure](1) for stage in ROOFLINE_STAGES}
        gb_s = max(before_gb_s, memory_bandwidth_gb_s(stages.device))
        bandwidths.append(gb_s)
        for stage, ms in round_ms.items():
            times[stage.time_figure].append(ms)
            fractions[stage.fraction_figure].append(weights[stage.weights] / (gb_s * 1e6) / ms)
    result: dict[str, Any] = {"roofline_rounds": rounds}
    for name, values in times.items():
        result[name] = round(statistics.median(values), 1)
    for name, values in fractions.items():
        result[name] = round(statistics.median(values), 3)
        result[f"{name}_range"] = [round(min(values), 3), round(max(values), 3)]
    result["memory_bandwidth_gb_s"] = round(statistics.median(bandwidths), 1)
    return result


def weight_bytes_per_step(model: DualARTransformer) -> dict[str, int]:
    """Bytes of weights one decode step reads: slow layers + norm + head once; the fast layers
    once per codebook position, their norm and head at every position but the first (whose
    logits are unused); embedding tables only a row each (ignored)."""

    def size(modules: list[torch.nn.Module]) -> int:
        tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
        packed = [p for m in modules for p in m.modules() if isinstance(p, PackedLinear)]
        return sum(t.numel() * t.element_size() for t in tensors) + sum(
            p.weight_bytes for p in packed
        )

    slow = size([*model.layers, model.norm] + ([model.output] if model.output else []))
    positions = model.config.num_codebooks
    fast = size([*model.fast_layers]) * positions
    fast += size([model.fast_norm, model.fast_output]) * (positions - 1)
    return {"slow": slow, "fast": fast, "total": slow + fast}


class StageBench:
    def __init__(self, passes: ModelPasses, options: BenchOptions) -> None:
        model = passes.model
        self.model = model
        self.options = options
        # The engine's two transformer passes (compiled with --compile where it compiles them).
        self.fast = passes.fast
        self.slow = passes.slow
        self.prefill = passes.prefill
        self.device = model.device
        slots = max(options.batches)
        self.cache: KVCache = model.allocate_cache(slots, min(1024, model.config.max_seq_len))
        self.windows = RepetitionWindows(slots, model.config.num_codebooks + 1, self.device)

    def prefill_ms(self, tokens: int) -> float:
        prompt = torch.randint(0, 500, (self.model.config.num_codebooks + 1, tokens))
        prompt = prompt.to(self.device)
        return median_ms(lambda: self.prefill(self.model, self.cache, prompt, 0, 0), 3, self.device)

    def _batch(
        self, batch: int, position: int = KV_POSITION
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        frames = torch.zeros(batch, self.model.config.num_codebooks + 1, dtype=torch.int32)
        frames[:, 0] = self.model.semantic_begin_id + 7
        slots = torch.arange(batch)
        positions = torch.full((batch,), position)
        return frames.to(self.device), slots.to(self.device), positions.to(self.device)

    def _slow_ms(self, cache: KVCache, batch: int, position: int) -> float:
        frames, slots, positions = self._batch(batch, position)
        return median_ms(
            lambda: self.slow(
                self.model, cache, frames[:, :, None], slots, positions, position + 1
            ),
            self.options.repeats,
            self.device,
        )

    def slow_step_ms(self, batch: int) -> float:
        return self._slow_ms(self.cache, batch, KV_POSITION)

    def long_context_slow_step_ms(self) -> float:
        """The slow step of one stream with :data:`LONG_KV_POSITION` cached positions."""
        length = min(LONG_KV_POSITION + 64, self.model.config.max_seq_len)
        return self._slow_ms(self.model.allocate_cache(1, length), 1, length - 64)

    def fast_ms(self, batch: int) -> float:
        """Sampling and the codebook transformer for one frame per row (as a decode step runs)."""
        return median_ms(self.codebook_pass(batch), self.options.repeats, self.device)

    def codebook_pass(self, batch: int) -> Callable[[], torch.Tensor]:
        """One frame's codebook pass for ``batch`` rows, as a decode step runs it."""
        hidden = torch.randn(batch, self.model.config.dim, device=self.device)
        hidden = hidden.to(self.model.dtype)
        logits = torch.randn(batch, self.model.config.vocab_size, device=self.device)
        logits = logits.to(self.model.dtype)
        sampling = BatchSampling.from_params([SamplingParams()] * batch, self.device)
        windows = self.windows.gather(torch.arange(batch, device=self.device))

        def frame() -> torch.Tensor:
            # drawn per frame, as the engine's decode step draws for unseeded streams
            noise = frame_noise(self.model, batch, upstream_draws=UPSTREAM_DRAWS)
            return sample_frame(
                self.model, self.cache, logits, hidden, sampling, windows, noise, self.fast
            )

        return frame

    def step_ms(self, batch: int) -> float:
        frames, slots, positions = self._batch(batch)
        sampling = BatchSampling.from_params([SamplingParams()] * batch, self.device)
        steps = torch.zeros(batch, dtype=torch.long, device=self.device)
        return median_ms(
            lambda: decode_step(
                self.model,
                self.cache,
                frames,
                slots,
                positions,
                KV_POSITION + 1,
                self.windows,
                steps,
                sampling,
                fast=self.fast,
                slow=self.slow,
                upstream_draws=UPSTREAM_DRAWS,
            ),
            self.options.repeats,
            self.device,
        )


def vocoder_rtf(decoder: IncrementalDecoder, chunk_frames: int = 8, chunks: int = 4) -> float:
    codes = torch.randint(0, 1000, (decoder.n_codebooks, chunk_frames * chunks))
    state = decoder.new_state()
    decoder.decode([state], [codes[:, :chunk_frames]])  # warm-up
    started_s = time.perf_counter()
    for i in range(chunks):
        decoder.decode([state], [codes[:, i * chunk_frames : (i + 1) * chunk_frames]])
    _sync(decoder.device)
    audio_s = codes.shape[1] * decoder.samples_per_frame / decoder.sample_rate
    return (time.perf_counter() - started_s) / audio_s


async def first_audio_ms(engine: FishEngine, options: SynthesisOptions, repeats: int) -> float:
    """Median time to the first audio of the 60-character sentence, one stream at a time."""
    ttfa = []
    for _ in range(repeats):
        stream = engine.open_stream("default", options)
        started_s = time.perf_counter()
        async for _pcm in stream.synthesize(SENTENCE_60_CHARS):
            ttfa.append(1000.0 * (time.perf_counter() - started_s))
            break
        stream.close()
    return statistics.median(ttfa)


async def paired_first_audio_steps(
    engine: FishEngine, options: BenchOptions, repeats: int
) -> list[float]:
    """First audio of the 60-character sentence over a batch-1 decode step timed right after
    it, once per repeat. ``ttfa_steps`` divides figures taken a minute apart, and this host's
    speed changes within minutes — its cores and its memory apart, while first audio waits on
    the first (the prefill) and a step on the second — so each ratio here pairs the two."""
    one_slot = dataclasses.replace(options, batches=(1,))
    stages = await engine.profile(lambda passes: StageBench(passes, one_slot))

    def step_ms(_passes: ModelPasses) -> float:
        with torch.inference_mode():
            return stages.step_ms(1)

    ratios = []
    for _ in range(repeats):
        ttfa_ms = await first_audio_ms(engine, SynthesisOptions(), 1)
        ratios.append(ttfa_ms / await engine.profile(step_ms))
    return ratios


async def end_to_end(engine: FishEngine, repeats: int) -> dict[str, float]:
    """Frames/s for one stream speaking a paragraph, and TTFA of a 60-character sentence."""
    stream = engine.open_stream("default", SynthesisOptions())
    text = "one two three four five six seven eight nine ten eleven twelve"
    started_s = time.perf_counter()
    samples = 0
    async for pcm in stream.synthesize(text):
        samples += pcm.size
    wall_s = time.perf_counter() - started_s
    stream.close()
    frames = samples / engine.sample_rate / engine.describe()["frame_s"]
    ttfa_ms = await first_audio_ms(engine, SynthesisOptions(), repeats)
    return {"frames_per_s": frames / wall_s, "ttfa_ms_p50": ttfa_ms}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_stages(passes: ModelPasses, options: BenchOptions) -> dict[str, Any]:
    """Every stage, on the model's thread (see :meth:`FishEngine.profile`)."""
    device = passes.model.device
    stages = StageBench(passes, options)
    weights = weight_bytes_per_step(passes.model)
    result: dict[str, Any] = {
        "weight_bytes_per_step": weights["total"],
        "codebook_pass_weight_bytes": weights["fast"],
    }
    with torch.inference_mode():
        for tokens in (64, 256):
            progress(f"  prefill {tokens} tokens ...")
            result[f"prefill_{tokens}_ms"] = round(stages.prefill_ms(tokens), 1)
        result.update(batch1_rounds(stages, weights))
        for batch in options.batches:
            if batch != 1:
                progress(f"  batch {batch}: slow step, fast transformer, whole step ...")
                result[f"slow_step_ms_b{batch}"] = round(stages.slow_step_ms(batch), 1)
                result[f"fast_ms_b{batch}"] = round(stages.fast_ms(batch), 1)
                result[f"step_ms_b{batch}"] = round(stages.step_ms(batch), 1)
            per_s = 1000.0 * batch / result[f"step_ms_b{batch}"]
            result[f"decode_frames_per_s_b{batch}"] = round(per_s, 1)
        progress(f"  batch 1 slow step at {LONG_KV_POSITION} cached positions ...")
        result["slow_step_ms_b1_long_context"] = round(stages.long_context_slow_step_ms(), 1)
        progress("  vocoder ...")
        result["vocoder_rtf"] = round(vocoder_rtf(passes.decoder), 3)
        if options.op_profile:
            progress("  codebook pass, op by op ...")
            gb_s = memory_bandwidth_gb_s(device)
            profile = op_profile(stages.codebook_pass(1))
            # How fast the linear kernels stream the pass's weights, against the bandwidth
            # measured just before: the ceiling they put on the pass's roofline fraction,
            # whatever the ops around them cost.
            if profile["matrix_products_ms"] > 0:
                streamed_gb_s = weights["fast"] / profile["matrix_products_ms"] / 1e6
                profile["memory_bandwidth_gb_s"] = round(gb_s, 1)
                profile["matrix_products_gb_s"] = round(streamed_gb_s, 1)
                profile["matrix_products_bandwidth_fraction"] = round(streamed_gb_s / gb_s, 3)
            result["codebook_pass_profile"] = profile
    return result


async def run_bench(options: BenchOptions) -> dict[str, Any]:
    device = choose_device(options.device)
    progress(f"bench: {options.model} on {device}, dtype {options.dtype}; loading ...")
    settings = FishSettings(
        device=options.device, dtype=options.dtype, max_streams=1, compile=options.compile
    )
    engine = FishEngine(options.model, settings)
    started_s = time.perf_counter()
    await engine.start()
    load_s = time.perf_counter() - started_s
    info = engine.describe()
    result: dict[str, Any] = {
        "model": options.model,
        "dtype": info["dtype"],
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "load_s": round(load_s, 1),
        # The process on transparent huge pages once loaded (streamtts.hugepages), MB.
        "huge_pages_mb": _rounded(hugepages.huge_pages_mb()),
        # Per half of the step: "fused" (a C++ op, streamtts.models.fish.fused) or
        # "python (why not fused)".
        "codebook_pass": info["codebook_pass"],
        "slow_step": info["slow_step"],
        # What multiplies the fast and the slow layers' weights: "row_linear" (AVX512-BF16, the
        # pairs layout), "onednn" (packed) or "aten" (streamtts.models.fish.fused.pairs).
        "fast_products": info["fast_products"],
        "slow_products": info["slow_products"],
        # What convolves in the vocoder: "row_conv (n convolutions), onednn" (AVX512-BF16, the
        # rest on oneDNN), "onednn" (packed) or "aten" (streamtts.models.fish.codec.blocks).
        "vocoder_convs": info["vocoder_convs"],
        "compile_s": round(sum(info["compile_s"].values()), 1),
        # Graphs compiled but timed no faster than eager at start, so run eager.
        "compiled_but_eager": info["compiled_but_eager"],
    }
    if options.op_profile:
        start_profiler_here()
    result.update(await engine.profile(lambda passes: measure_stages(passes, options)))
    progress("  end to end ...")
    e2e = await end_to_end(engine, options.repeats)
    progress("  first audio, each against a decode step timed after it ...")
    paired = await paired_first_audio_steps(engine, options, options.repeats)
    for frames in options.first_chunk_frames:
        progress(f"  first audio with a first chunk of {frames} frames ...")
        ttfa_ms = await first_audio_ms(
            engine, SynthesisOptions(first_chunk_frames=frames), options.repeats
        )
        ttfa_ms = round(ttfa_ms, 1)
        result[f"ttfa_ms_p50_first_chunk_{frames}"] = ttfa_ms
        result[f"ttfa_steps_first_chunk_{frames}"] = round(ttfa_ms / result["step_ms_b1"], 2)
    await engine.stop()

    def roofline(weight_bytes: int) -> float:  # ms to read them once at the median bandwidth
        return round(weight_bytes / (float(result["memory_bandwidth_gb_s"]) * 1e6), 1)

    # Generator and vocoder per frame alone (the batch-1 step; the vocoder in 8-frame chunks)
    # against both through the engine: on a GPU they overlap on their own CUDA streams (the
    # ratio nears 2 when they cost the same), on the CPU the vocoder runs inline (about 1).
    vocoder_ms = result["vocoder_rtf"] * info["frame_s"] * 1000
    both_ms = 1000 / e2e["frames_per_s"]
    ttfa_ms_p50 = round(e2e["ttfa_ms_p50"], 1)  # the ratio below is of the figures reported
    result.update(
        {
            "vocoder_ms_per_frame": round(vocoder_ms, 2),
            "engine_ms_per_frame": round(both_ms, 2),
            "overlap": round((result["step_ms_b1"] + vocoder_ms) / both_ms, 3),
            "frames_per_s": round(e2e["frames_per_s"], 1),
            "realtime_factor_b1": round(1 / (info["frame_s"] * e2e["frames_per_s"]), 3),
            "ttfa_ms_p50": ttfa_ms_p50,
            # First audio in decode steps of one stream: prefill, first chunk, its vocoding.
            "ttfa_steps": round(ttfa_ms_p50 / result["step_ms_b1"], 2),
            # The same, each first audio against a step timed right after it: the median, and
            # the range over the repeats (paired_first_audio_steps).
            "ttfa_steps_paired": round(statistics.median(paired), 2),
            "ttfa_steps_paired_range": [round(min(paired), 2), round(max(paired), 2)],
            "roofline_step_ms": roofline(result["weight_bytes_per_step"]),
            "roofline_codebook_pass_ms": roofline(result["codebook_pass_weight_bytes"]),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }
    )
    return result


def run(options: BenchOptions) -> dict[str, Any]:
    return asyncio.run(run_bench(options))
