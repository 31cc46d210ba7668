"""An in-process engine for server tests that are not about a model: deterministic tones, as
many samples per character as asked, optional slots, a failure on demand. No torch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from streamtts.engine.base import (
    Capacity,
    Engine,
    EngineStream,
    OverloadedError,
    PcmF32,
    StreamStats,
    SynthesisError,
    SynthesisOptions,
    UnknownVoiceError,
    VoiceInfo,
)
from streamtts.options import PIPER

FAIL = "[fail]"  # a segment with this text fails inside the engine
VOICE = "fake-voice"


class FakeEngine(Engine):
    name = "fake"

    def __init__(
        self,
        kind: str = PIPER,
        rate_hz: int = 16_000,
        samples_per_char: int = 160,
        chunk_samples: int = 1600,
        chunk_delay_s: float = 0.0,
        slots: int | None = None,
    ) -> None:
        self.kind = kind  # type: ignore[misc]  # which engine of the option table it plays
        self._rate_hz = rate_hz
        self.samples_per_char = samples_per_char
        self.chunk_samples = chunk_samples
        self.chunk_delay_s = chunk_delay_s
        self._slots = slots
        self.open_streams: set[FakeStream] = set()
        self.streams: list[FakeStream] = []  # every stream ever opened, in order
        self.opened: list[SynthesisOptions] = []
        self.started = False

    @property
    def sample_rate(self) -> int:
        return self._rate_hz

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(VOICE, "Fake", "en", self.kind, "test tones")]

    @property
    def default_voice(self) -> str:
        return VOICE

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def capacity(self) -> Capacity:
        if self._slots is None:
            return Capacity()
        return Capacity(self._slots, self._slots - len(self.open_streams))

    def describe(self) -> dict[str, Any]:
        return {"engine": self.kind, "model": "fake"}

    def _open_stream(self, voice: str, options: SynthesisOptions) -> EngineStream:
        if voice != VOICE:
            raise UnknownVoiceError(f"unknown voice {voice!r}")
        if self._slots is not None and len(self.open_streams) >= self._slots:
            raise OverloadedError("all fake slots are busy")
        self.opened.append(options)
        stream = FakeStream(self)
        self.open_streams.add(stream)
        self.streams.append(stream)
        return stream


class FakeStream(EngineStream):
    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine
        self.cancelled = threading.Event()
        self.closed = False
        self.segments: list[str] = []
        self.stats = StreamStats()

    async def synthesize(self, text: str) -> AsyncIterator[PcmF32]:
        if FAIL in text:
            raise SynthesisError("the fake engine was asked to fail")
        self.segments.append(text)
        engine = self._engine
        total = len(text) * engine.samples_per_char
        t = np.arange(total, dtype=np.float32) / engine.sample_rate
        tone = (0.3 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)
        for start in range(0, total, engine.chunk_samples):
            if self.cancelled.is_set():
                return
            await asyncio.sleep(engine.chunk_delay_s)
            piece = tone[start : start + engine.chunk_samples]
            self.stats.audio_samples += piece.size
            yield piece
        self.stats.segments += 1

    def cancel(self) -> None:
        self.cancelled.set()

    def close(self) -> None:
        self.cancel()
        self.closed = True
        self._engine.open_streams.discard(self)
