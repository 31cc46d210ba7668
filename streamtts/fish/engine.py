"""The Fish-Speech 1.5 streaming engine: the asyncio face of the generator and vocoder threads.

``open_stream`` reserves a KV slot (or refuses at once with ``overloaded``); each
``synthesize(text)`` submits one segment job and yields PCM as the vocoder thread produces it.
Nothing here runs torch on the event loop: model loading happens in a thread, and the workers
own all tensor work.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch

from streamtts.engine.base import (
    Engine,
    EngineError,
    EngineStream,
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
    run_on_own_thread,
    set_cpu_threads,
)
from streamtts.fish.generator import GeneratorConfig, GeneratorWorker
from streamtts.fish.jobs import ChunkSchedule, SegmentJob, StreamSlot
from streamtts.fish.load import FishBundle, load_fish_bundle
from streamtts.fish.vocoder import VocoderWorker
from streamtts.models.fish.codec.incremental import IncrementalDecoder
from streamtts.models.fish.llm.llama import fuse_gate_up_
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.quantize import is_int8, quantize_int8_
from streamtts.models.fish.llm.sampling import SamplingParams
from streamtts.models.fish.llm.synthetic import synthetic_frame_budget
from streamtts.models.fish.llm.text import split_piece
from streamtts.models.fish.packed import can_pack, pack_linears_

log = logging.getLogger(__name__)

DEFAULT_VOICE_ID = "default"
INT8 = "int8"  # dtype setting: int8 weight-only linear layers, bf16 activations (CPU)


class InvalidOptionsError(EngineError):
    code = "invalid_field"


@dataclass(frozen=True)
class FishSettings:
    device: str = "auto"
    dtype: str = "auto"
    max_streams: int = 8
    context_tokens: int = 4096
    first_chunk_frames: int = 4
    chunk_frames: int = 8
    prefill_chunk_tokens: int = 128
    max_frames_per_segment: int = 1024
    max_lead_s: float = 6.0
    cpu_threads: int = 0  # torch intra-op threads, process-wide (0: one per core)
    compile: bool = False  # torch.compile the decode step at start (see engine.compiled)


class FishEngine(Engine):
    name = "fish"
    sample_rate = 44_100

    def __init__(self, spec: str, settings: FishSettings) -> None:
        self._spec = spec
        self._settings = settings
        self._bundle: FishBundle | None = None
        self._generator: GeneratorWorker | None = None
        self._vocoder: VocoderWorker | None = None
        self._fatal: BaseException | None = None
        self.name = f"fish:{spec}" if spec.startswith("synthetic:") else "fish"

    # ---- lifecycle ----

    async def start(self) -> None:
        await run_on_own_thread(self._load, "fish-load")
        await self._warm_up()

    def _load(self) -> None:
        s = self._settings
        device = choose_device(s.device)
        int8 = s.dtype == INT8
        dtype = choose_dtype("bf16" if int8 else s.dtype, device)
        set_cpu_threads(s.cpu_threads)
        log.info("loading %s on %s in %s", self._spec, device, INT8 if int8 else dtype)
        bundle = load_fish_bundle(self._spec, device, dtype)
        model = bundle.llm.model
        if int8:
            fuse_gate_up_(model)
            quantize_int8_(model)
        elif can_pack(model):
            # A compiled codebook pass packs its own weights (inductor freezing).
            compiled_part = (model.fast_layers, model.fast_output) if s.compile else ()
            fuse_gate_up_(model, compiled_part)
            packed = pack_linears_(model, skip=compiled_part)
            log.info("packed %d linear layers into oneDNN's layout", packed)
        context_tokens = min(s.context_tokens, model.config.max_seq_len)
        cache = model.allocate_cache(s.max_streams + 1, context_tokens)
        context = DeviceContext(device)
        tokenizer = bundle.llm.tokenizer
        decoder = IncrementalDecoder(bundle.decoder, device, dtype)
        # On the CPU the vocoder runs on the generator thread: one torch thread (see devices).
        vocoder = VocoderWorker(decoder, context, self._on_fatal, inline=not context.is_cuda)
        self._generator = GeneratorWorker(
            model,
            cache,
            PromptBuilder(tokenizer, model.config.num_codebooks),
            tokenizer.im_end_id,
            context,
            GeneratorConfig(s.prefill_chunk_tokens, context_tokens, s.max_lead_s, s.compile),
            self._on_fatal,
            after_iteration=vocoder.drain if vocoder.inline else lambda: None,
        )
        self.sample_rate = decoder.sample_rate
        self._vocoder = vocoder
        self._bundle = bundle
        self._generator.start()
        self._vocoder.start()

    async def _warm_up(self) -> None:
        stream = self.open_stream(DEFAULT_VOICE_ID, SynthesisOptions(max_frames_per_segment=8))
        try:
            async for _ in stream.synthesize("Warming up."):
                pass
        finally:
            stream.close()

    async def stop(self) -> None:
        for worker in (self._generator, self._vocoder):
            if worker is not None:
                await asyncio.to_thread(worker.stop)

    def _on_fatal(self, exc: BaseException) -> None:
        self._fatal = exc

    def healthy(self) -> bool:
        workers = (self._generator, self._vocoder)
        alive = all(w is not None and w.is_alive() for w in workers)
        return self._fatal is None and (alive or self._bundle is None)

    # ---- voices and streams ----

    def voices(self) -> list[VoiceInfo]:
        description = (
            "synthetic random weights: noise, not speech"
            if self._spec.startswith("synthetic:")
            else "the model's own voice (no reference)"
        )
        return [VoiceInfo(DEFAULT_VOICE_ID, "Fish-Speech default", "multi", "fish", description)]

    @property
    def default_voice(self) -> str:
        return DEFAULT_VOICE_ID

    @property
    def generator(self) -> GeneratorWorker:
        if self._generator is None:
            raise EngineError("engine not started")
        return self._generator

    @property
    def decoder(self) -> IncrementalDecoder:
        if self._vocoder is None:
            raise EngineError("engine not started")
        return self._vocoder.decoder

    def open_stream(self, voice: str, options: SynthesisOptions) -> EngineStream:
        if voice != DEFAULT_VOICE_ID:
            raise UnknownVoiceError(f"unknown voice {voice!r}")
        if self._bundle is None or self._generator is None or self._vocoder is None:
            raise EngineError("engine not started")
        if self._fatal is not None:
            raise EngineError("the engine has failed; see the server log")
        params = _sampling_params(options)
        slot = self._generator.acquire()
        if slot is None:
            raise OverloadedError(
                f"all {self._generator.capacity} streams are busy; try again shortly"
            )
        s = self._settings
        schedule = ChunkSchedule(
            options.first_chunk_frames or s.first_chunk_frames,
            options.chunk_frames or s.chunk_frames,
        )
        return FishStream(
            generator=self._generator,
            vocoder=self._vocoder,
            slot=slot,
            params=params,
            schedule=schedule,
            max_frames=options.max_frames_per_segment or s.max_frames_per_segment,
            synthetic=self._bundle.synthetic,
        )


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
        )
    except ValueError as exc:
        raise InvalidOptionsError(str(exc)) from exc


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


class FishStream(EngineStream):
    def __init__(
        self,
        generator: GeneratorWorker,
        vocoder: VocoderWorker,
        slot: StreamSlot,
        params: SamplingParams,
        schedule: ChunkSchedule,
        max_frames: int,
        synthetic: bool,
    ) -> None:
        self._generator = generator
        self._vocoder = vocoder
        self._slot = slot
        self._voice = vocoder.new_stream()
        self._params = params
        self._schedule = schedule
        self._max_frames = max_frames
        self._synthetic = synthetic
        self._handoff: PcmHandoff | None = None
        self._closed = threading.Event()
        self.stats = StreamStats()

    @property
    def slot(self) -> StreamSlot:
        return self._slot

    @property
    def params(self) -> SamplingParams:
        return self._params

    @property
    def schedule(self) -> ChunkSchedule:
        return self._schedule

    async def synthesize(self, text: str) -> AsyncIterator[PcmF32]:
        # Upstream's splitter strips each piece after cleaning and drops one with nothing to
        # say (e.g. only emoji): no prompt, no speech.
        piece = split_piece(text)
        if self._slot.cancelled.is_set() or not piece:
            return
        handoff = PcmHandoff()
        self._handoff = handoff
        self._voice.on_pcm = handoff.post
        self._voice.on_segment_end = handoff.end
        self._voice.on_error = handoff.post
        self._generator.submit(self._job(piece, handoff))
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
        self._slot.cancelled.set()
        self._voice.cancelled.set()
        self._generator.wake()
        if self._handoff is not None:
            self._handoff.end()

    def close(self) -> None:
        self.cancel()
        if not self._closed.is_set():
            self._closed.set()
            self._generator.release(self._slot)
