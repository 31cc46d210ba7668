"""The Fish-Speech 1.5 streaming engine: the asyncio face of the generator and vocoder threads.

``open_stream`` reserves a KV slot (or refuses at once with ``overloaded``); each
``synthesize(text)`` submits one segment job and yields PCM as the vocoder produces it. Nothing
here runs torch on the event loop: loading happens on a thread of its own, the workers own all
tensor work, and a stream's tensors (decoder state, random generator, prompt) are made on the
workers at its first segment.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import torch

from streamtts.engine.base import (
    Capacity,
    ClonedVoice,
    Codes,
    Engine,
    EngineNotReadyError,
    EngineStream,
    InvalidOptionError,
    InvalidReferenceError,
    OverloadedError,
    PcmF32,
    StreamStats,
    SynthesisOptions,
    UnknownVoiceError,
    VoiceInfo,
)
from streamtts.engine.handoff import PcmHandoff
from streamtts.fish.devices import (
    DeviceContext,
    choose_device,
    choose_dtype,
    emulation_warning,
    run_on_own_thread,
    set_cpu_threads,
)
from streamtts.fish.generator import GeneratorWorker, JobHook
from streamtts.fish.jobs import ChunkSchedule, SegmentJob, StreamSlot
from streamtts.fish.load import load_fish_bundle, prepare_llm, vocoder_row_convs
from streamtts.fish.settings import FishSettings
from streamtts.fish.spec import FishSpec
from streamtts.fish.vocoder import VocoderStream, VocoderWorker
from streamtts.models.fish.codec.encoder import FireflyEncoder, encode_reference
from streamtts.models.fish.codec.incremental import IncrementalDecoder
from streamtts.models.fish.fused.pairs import products
from streamtts.models.fish.llm.generate import FastCodes, Prefill, SlowStep
from streamtts.models.fish.llm.llama import DualARTransformer
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.quantize import is_int8
from streamtts.models.fish.llm.sampling import SamplingParams
from streamtts.models.fish.llm.synthetic import synthetic_frame_budget
from streamtts.models.fish.llm.text import split_piece
from streamtts.options import FISH, OptionError
from streamtts.scheduling import SchedulingSettings

log = logging.getLogger(__name__)

DEFAULT_VOICE_ID = "default"
WARM_UP_FRAMES = 8

T = TypeVar("T")


@dataclass(frozen=True)
class ModelPasses:
    """What the engine runs, for the stage profiler (``streamtts bench``): the model, its
    vocoder, the two transformer passes decode steps use (eager, or compiled) and the prefill."""

    model: DualARTransformer
    decoder: IncrementalDecoder
    fast: FastCodes
    slow: SlowStep
    prefill: Prefill


@dataclass(frozen=True)
class _Loaded:
    generator: GeneratorWorker
    vocoder: VocoderWorker
    encoder: FireflyEncoder
    codec_id: str
    synthetic: bool
    frame_s: float
    sample_rate: int
    device: torch.device
    dtype: str
    fast_products: str
    slow_products: str


class FishEngine(Engine):
    kind = FISH
    supports_cloning = True

    def __init__(
        self,
        spec: str | FishSpec,
        settings: FishSettings,
        scheduling: SchedulingSettings | None = None,
        job_hook: JobHook | None = None,
    ) -> None:
        parsed = FishSpec.parse(spec) if isinstance(spec, str) else spec
        if parsed is None:
            raise ValueError(f"{spec!r} is neither a checkpoint directory nor synthetic:<size>")
        self._spec = parsed
        self._settings = settings
        self._scheduling = scheduling or SchedulingSettings()
        self._job_hook = job_hook  # test seam (streamtts.engine.faults)
        self._loaded: _Loaded | None = None
        self._fatal: BaseException | None = None
        self.name = parsed.engine_name

    # ---- lifecycle ----

    async def start(self) -> None:
        self._loaded = await run_on_own_thread(self._load, "fish-load")
        self._loaded.generator.start()
        self._loaded.vocoder.start()
        await self._warm_up()

    def _load(self) -> _Loaded:
        s = self._settings
        device = choose_device(s.device)
        dtype = choose_dtype(s.dtype, device)  # int8: its activations
        set_cpu_threads(s.cpu_threads)
        log.info(
            "loading %s on %s: dtype %s, computing in %s", self._spec.text, device, s.dtype, dtype
        )
        if (warning := emulation_warning(dtype, device)) is not None:
            log.warning("dtype %s: %s", s.dtype, warning)
        bundle = load_fish_bundle(self._spec, device, dtype)
        model = bundle.llm.model
        prepare_llm(model, s)
        # One slot per stream; voice prefixes are kept apart (see streamtts.fish.prefixes).
        cache = model.allocate_cache(s.max_streams, min(s.context_tokens, model.config.max_seq_len))
        context = DeviceContext(device)
        tokenizer = bundle.llm.tokenizer
        decoder = IncrementalDecoder(
            bundle.decoder,
            device,
            dtype,
            pack_fp32=not s.parity,
            in_place=True,
            row_convs=vocoder_row_convs(s, device, dtype),
        )
        # On the CPU the vocoder runs on the generator thread: one torch thread (see devices).
        vocoder = VocoderWorker(decoder, context, self._on_fatal, inline=not context.is_cuda)
        frame_s = decoder.samples_per_frame / decoder.sample_rate
        generator = GeneratorWorker(
            model,
            cache,
            PromptBuilder(tokenizer, model.config.num_codebooks),
            tokenizer.im_end_id,
            context,
            s,
            self._scheduling,
            self._on_fatal,
            frame_s,
            after_iteration=vocoder.drain if vocoder.inline else lambda: None,
        )
        generator.before_job_work = self._job_hook
        return _Loaded(
            generator,
            vocoder,
            bundle.encoder,
            bundle.codec_id,
            self._spec.synthetic,
            frame_s=frame_s,
            sample_rate=decoder.sample_rate,
            device=device,
            dtype=describe_dtype(model),
            fast_products=products(model.fast_layers),
            slow_products=products(model.layers),
        )

    async def _warm_up(self) -> None:
        """Run the real path once with one stream, then with every slot at once: the second
        measures what larger batches cost (up to the full one; the streams start out of step
        while others prefill, so not always all of them together), so admission knows the
        capacity from the start. Not where admission will keep to one stream whatever a batch
        costs (:meth:`_admits_one`): there it is seconds of start-up (19 s of 37 on the 2-core
        dev machine, fp32) that nothing would use."""
        options = SynthesisOptions(max_frames_per_segment=WARM_UP_FRAMES)
        for streams in sorted({1, self._settings.max_streams}):
            if streams > 1 and self._admits_one():
                log.info(
                    "warm-up: one stream costs %.2f s of compute per second of audio, over the"
                    " %.2f admission allows a second: a full batch is not measured",
                    self._cost_of_one(),
                    1 - self._scheduling.capacity_headroom,
                )
                return
            opened = [self.open_stream(DEFAULT_VOICE_ID, options) for _ in range(streams)]
            try:
                await asyncio.gather(*(_drain(s.synthesize("Warming up.")) for s in opened))
            finally:
                for stream in opened:
                    stream.close()

    def _cost_of_one(self) -> float | None:
        generator = self._ready().generator
        with generator.cost_lock:
            return generator.cost.cost(1)

    def _admits_one(self) -> bool:
        """Admission by capacity keeps to one stream at a time: one stream alone costs more
        than it allows for streams at real time (``1 - capacity_headroom``), and a step of a
        larger batch costs at least what a step of one does."""
        cost = self._cost_of_one()
        limit = 1 - self._scheduling.capacity_headroom
        return self._scheduling.admit_by_capacity and cost is not None and cost > limit

    async def stop(self) -> None:
        if self._loaded is not None:
            for worker in (self._loaded.generator, self._loaded.vocoder):
                await asyncio.to_thread(worker.stop)

    def _on_fatal(self, exc: BaseException) -> None:
        self._fatal = exc

    def healthy(self) -> bool:
        if self._fatal is not None:
            return False
        loaded = self._loaded
        return loaded is None or (loaded.generator.is_alive() and loaded.vocoder.is_alive())

    # ---- what the server asks ----

    @property
    def sample_rate(self) -> int:
        return self._ready().sample_rate

    def voices(self) -> list[VoiceInfo]:
        description = self._spec.voice_description
        return [VoiceInfo(DEFAULT_VOICE_ID, "Fish-Speech default", "multi", FISH, description)]

    @property
    def default_voice(self) -> str:
        return DEFAULT_VOICE_ID

    def codec_id(self) -> str | None:
        return self._ready().codec_id

    async def encode_reference(self, samples: PcmF32, rate_hz: int) -> Codes:
        """The reference's codes [8, T], by the Firefly encoder on a thread of its own.

        Not on the generator's thread: encoding 30 s of audio takes seconds on a CPU, and the
        streams being generated would stall for that long; alongside, they only slow down."""
        loaded = self._ready()
        context = DeviceContext(loaded.device)

        def encode() -> Codes:
            with context.worker_stream("fish-encode"), torch.inference_mode():
                codes = encode_reference(loaded.encoder, samples, rate_hz)
                return codes.cpu().numpy().astype(np.int32)

        try:
            return await run_on_own_thread(encode, "fish-encode")
        except ValueError as exc:  # e.g. shorter than one analysis window
            raise InvalidReferenceError(str(exc)) from exc

    def forget_voice(self, voice_id: str) -> None:
        if self._loaded is not None:
            self._loaded.generator.forget_voice(voice_id)

    def capacity(self) -> Capacity:
        if self._loaded is None:
            return Capacity()
        generator = self._loaded.generator
        with generator.cost_lock:
            realtime = generator.cost.realtime_streams(
                generator.capacity, self._scheduling.capacity_headroom
            )
        return Capacity(generator.capacity, generator.free_slots, realtime)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"engine": FISH, "model": self._spec.text}
        if self._loaded is not None:
            loaded = self._loaded
            info |= {
                "device": str(loaded.device),
                "dtype": loaded.dtype,
                "max_streams": loaded.generator.capacity,
                "frame_s": loaded.frame_s,
                "codebook_pass": loaded.generator.decode_ops.codebook_pass,
                "fast_products": loaded.fast_products,
                "slow_products": loaded.slow_products,
                "slow_step": loaded.generator.decode_ops.slow_step,
                "vocoder_convs": loaded.vocoder.decoder.conv_kernels,
                "compile_s": dict(loaded.generator.compile_s),
                "compiled_but_eager": list(loaded.generator.eager_graphs),
            }
        return info

    def profile(self, fn: Callable[[ModelPasses], T]) -> asyncio.Future[T]:
        """Run ``fn`` on the model's thread between iterations (the stage profiler measures
        there: a second torch thread would slow every kernel on the CPU, see devices)."""
        loaded = self._ready()
        vocoder = loaded.vocoder
        generator = loaded.generator

        def call() -> T:
            return fn(
                ModelPasses(
                    generator.model,
                    vocoder.decoder,
                    generator.fast,
                    generator.slow,
                    generator.prefill,
                )
            )

        future = cast(Future[T], generator.call(call))
        return asyncio.wrap_future(future)

    def _ready(self) -> _Loaded:
        if self._loaded is None:
            raise EngineNotReadyError("the engine is not started")
        return self._loaded

    def _open_stream(self, voice: str | ClonedVoice, options: SynthesisOptions) -> EngineStream:
        if isinstance(voice, str) and voice != DEFAULT_VOICE_ID:
            raise UnknownVoiceError(f"unknown voice {voice!r}")
        loaded = self._ready()
        if self._fatal is not None:
            raise EngineNotReadyError("the engine has failed; see the server log")
        params = _sampling_params(options)
        cloned = voice if isinstance(voice, ClonedVoice) else None
        slot = loaded.generator.acquire(loaded.frame_s, cloned)
        if slot is None:
            raise OverloadedError(
                f"all {loaded.generator.capacity} streams are busy; try again shortly"
            )
        s = self._settings
        first_frames = options.first_chunk_frames or s.first_chunk_frames
        # A seeded stream's chunks follow a fixed schedule, so its audio is the same every time.
        timed = params.seed is None
        if not first_frames:
            cost = None
            if timed:
                generator = loaded.generator
                with generator.cost_lock:  # at the batch size with this stream
                    cost = generator.cost.cost(generator.capacity - generator.free_slots)
            first_frames = ChunkSchedule.auto_first_frames(cost)
        schedule = ChunkSchedule(first_frames, options.chunk_frames or s.chunk_frames, timed)
        return FishStream(
            sample_rate=loaded.sample_rate,
            generator=loaded.generator,
            vocoder=loaded.vocoder,
            slot=slot,
            params=params,
            schedule=schedule,
            max_frames=options.max_frames_per_segment or s.max_frames_per_segment,
            synthetic=loaded.synthetic,
        )


async def _drain(chunks: AsyncIterator[PcmF32]) -> None:
    async for _ in chunks:
        pass


def describe_dtype(model: torch.nn.Module) -> str:
    """``bfloat16``, ``float32``...; ``int8+bfloat16`` for int8 weight-only layers."""
    activations = str(next(model.parameters()).dtype).removeprefix("torch.")
    return f"int8+{activations}" if is_int8(model) else activations


def _sampling_params(options: SynthesisOptions) -> SamplingParams:
    defaults = SamplingParams()
    try:
        return SamplingParams(
            temperature=_or(options.temperature, defaults.temperature),
            top_p=_or(options.top_p, defaults.top_p),
            repetition_penalty=_or(options.repetition_penalty, defaults.repetition_penalty),
            seed=options.seed,
        )
    except OptionError as exc:
        raise InvalidOptionError(exc.option, exc.message) from exc


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


class FishStream(EngineStream):
    def __init__(
        self,
        sample_rate: int,
        generator: GeneratorWorker,
        vocoder: VocoderWorker,
        slot: StreamSlot,
        params: SamplingParams,
        schedule: ChunkSchedule,
        max_frames: int,
        synthetic: bool,
    ) -> None:
        self.sample_rate = sample_rate
        self._generator = generator
        self._vocoder = vocoder
        self._slot = slot
        self._voice = VocoderStream(slot.cancelled)  # one cancel token for both workers
        self._params = params
        self._schedule = schedule
        self._max_frames = max_frames
        self._synthetic = synthetic
        self._handoff: PcmHandoff | None = None
        self._prepared: tuple[str, SegmentJob, PcmHandoff] | None = None  # (piece, job, its audio)
        self._closed = threading.Event()
        self.stats = StreamStats()

    @property
    def slot(self) -> StreamSlot:
        return self._slot

    def prepare(self, text: str) -> None:
        """The likely next segment is prefilled and its first chunk's frames made now; they go
        to the vocoder once :meth:`synthesize` confirms the text (another text drops them and
        rewinds the conversation). Not for a seeded stream, whose audio must not depend on
        timing (its chunks would)."""
        piece = split_piece(text)
        if self._slot.cancelled.is_set() or not piece or self._params.seed is not None:
            return
        if self._prepared is not None:
            if self._prepared[0] == piece:
                return
            self._generator.drop(self._prepared[1])
        handoff = PcmHandoff()
        job = self._job(piece, handoff)
        job.held = True
        self._generator.submit(job)
        self._prepared = (piece, job, handoff)

    async def synthesize(self, text: str) -> AsyncIterator[PcmF32]:
        # Upstream's splitter strips each piece after cleaning and drops one with nothing to
        # say (e.g. only emoji): no prompt, no speech.
        piece = split_piece(text)
        prepared, self._prepared = self._prepared, None
        if prepared is not None and (prepared[0] != piece or self._slot.cancelled.is_set()):
            self._generator.drop(prepared[1])
            prepared = None
        if self._slot.cancelled.is_set() or not piece:
            return
        if prepared is None:
            handoff = PcmHandoff()
            job = self._job(piece, handoff)
        else:
            _, job, handoff = prepared
        self._handoff = handoff
        self._voice.on_pcm = handoff.post
        self._voice.on_segment_end = handoff.end
        self._voice.on_error = handoff.post
        if prepared is None:
            self._generator.submit(job)
        else:
            self._generator.confirm(job)
        started_s = time.perf_counter()
        try:
            async for pcm in handoff.chunks(self.stats, "Fish"):
                yield pcm
            if not self._slot.cancelled.is_set():
                self.stats.segments += 1
        finally:
            self.stats.compute_s += time.perf_counter() - started_s

    def _job(self, text: str, handoff: PcmHandoff) -> SegmentJob:
        # A synthetic model's random weights would stop at random: it speaks as long as real
        # speech of this text would take instead (its prefill frame is not vocoded: +1).
        max_frames = self._max_frames
        if self._synthetic:
            max_frames = min(max_frames, synthetic_frame_budget(text) + 1)
        voice = self._voice
        vocoder = self._vocoder

        def on_codes(codes: torch.Tensor, final: bool) -> None:
            vocoder.submit(voice, codes, final)

        return SegmentJob(
            stream=self._slot,
            text=text,
            params=self._params,
            max_frames=max_frames,
            stop_on_im_end=not self._synthetic,
            schedule=self._schedule,
            on_codes=on_codes,
            on_error=handoff.post,
        )

    def cancel(self) -> None:
        self._slot.cancelled.set()  # both workers drop this stream's work from now on
        self._prepared = None  # (a prepared job too)
        if self._handoff is not None:
            self._handoff.stop()  # the coroutine waiting for audio returns at once

    def close(self) -> None:
        self.cancel()
        if not self._closed.is_set():
            self._closed.set()
            self._generator.release(self._slot)
