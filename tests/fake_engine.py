"""An in-process engine for server tests that are not about a model: deterministic tones, as
many samples per character as asked, optional slots, a failure on demand. No torch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from streamtts.engine.base import (
    Capacity,
    ClonedVoice,
    Codes,
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
        clones: bool = False,
        codec: str = "fake-codec",
        realtime_streams: float | None = None,
    ) -> None:
        """``realtime_streams``: the real-time capacity it reports as measured (admission by
        capacity reads it)."""
        self.kind = kind  # type: ignore[misc]  # which engine of the option table it plays
        self.supports_cloning = clones  # type: ignore[misc]
        self._codec = codec
        self.forgotten: list[str] = []
        self._rate_hz = rate_hz
        self.samples_per_char = samples_per_char
        self.chunk_samples = chunk_samples
        self.chunk_delay_s = chunk_delay_s
        self._slots = slots
        self.realtime_streams = realtime_streams
        self.open_streams: set[FakeStream] = set()
        self.streams: list[FakeStream] = []  # every stream opened, in order
        self.opened: list[SynthesisOptions] = []
        self.cloned_voices_opened: list[ClonedVoice] = []
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
            return Capacity(realtime_streams=self.realtime_streams)
        free = self._slots - len(self.open_streams)
        return Capacity(self._slots, free, self.realtime_streams)

    def describe(self) -> dict[str, Any]:
        return {"engine": self.kind, "model": "fake"}

    def codec_id(self) -> str | None:
        return self._codec if self.supports_cloning else None

    async def encode_reference(self, samples: PcmF32, rate_hz: int) -> Codes:
        """21.5 frames per second of reference, each code the frame's loudness (not a codec)."""
        if not self.supports_cloning:
            return await super().encode_reference(samples, rate_hz)
        frames = max(1, int(samples.size / rate_hz * 21.5))
        loud = np.abs(samples[: frames * (samples.size // frames)]).reshape(frames, -1).mean(1)
        return np.repeat((loud * 999).astype(np.int32)[None], 8, axis=0)

    def forget_voice(self, voice_id: str) -> None:
        self.forgotten.append(voice_id)

    def _open_stream(self, voice: str | ClonedVoice, options: SynthesisOptions) -> EngineStream:
        if isinstance(voice, ClonedVoice):
            self.cloned_voices_opened.append(voice)
        elif voice != VOICE:
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
        self.sample_rate = engine.sample_rate
        self.cancelled = threading.Event()
        self.closed = False
        self.segments: list[str] = []
        self.prepared: list[str] = []  # the texts it was told are likely next
        self.stats = StreamStats()
        # time.monotonic() of each chunk handed out, and of the cancel (the barge-in tests)
        self.chunk_times: list[float] = []
        self.cancelled_at: float | None = None

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
            if self.cancelled.is_set():
                return
            piece = tone[start : start + engine.chunk_samples]
            self.stats.audio_samples += piece.size
            self.chunk_times.append(time.monotonic())
            yield piece
        self.stats.segments += 1

    def prepare(self, text: str) -> None:
        self.prepared.append(text)

    def cancel(self) -> None:
        if self.cancelled_at is None:
            self.cancelled_at = time.monotonic()
        self.cancelled.set()

    def close(self) -> None:
        self.cancelled.set()  # implies cancel; ``cancelled_at`` is for real cancels only
        self.closed = True
        self._engine.open_streams.discard(self)
