"""The engine contract: how the server asks a model for speech.

An engine turns text segments into float32 mono PCM at its native ``sample_rate``. The server
opens one :class:`EngineStream` per context (utterance stream) and feeds it segments in order;
an engine may keep state across the segments of one stream (Fish-Speech keeps the iterative
prompt history there so the voice stays consistent).

Threading rule: every method here is called from the event loop and must return quickly.
Model work happens on the engine's own worker threads; audio comes back through the async
iterator returned by :meth:`EngineStream.synthesize`.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

PcmF32 = npt.NDArray[np.float32]


class EngineError(Exception):
    """A failure of one segment's synthesis; only the context that asked for it is affected."""

    code = "internal"


class UnknownVoiceError(EngineError):
    code = "unknown_voice"


class OverloadedError(EngineError):
    """The engine has no free capacity (e.g. no KV slot) for a new stream."""

    code = "overloaded"


@dataclass(frozen=True)
class SynthesisOptions:
    """Per-stream knobs. ``None`` means the engine's default."""

    speed: float = 1.0
    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    # Frames (Fish) before the first audio chunk is vocoded, then the size of later chunks.
    first_chunk_frames: int | None = None
    chunk_frames: int | None = None
    max_frames_per_segment: int | None = None


@dataclass(frozen=True)
class VoiceInfo:
    id: str
    name: str
    language: str
    engine: str
    description: str = ""


@dataclass
class StreamStats:
    """Filled in by the engine as a stream runs; read by the server for ``done`` stats."""

    segments: int = 0
    audio_samples: int = 0
    compute_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class EngineStream(abc.ABC):
    """One utterance stream inside an engine."""

    stats: StreamStats

    @abc.abstractmethod
    def synthesize(self, text: str) -> AsyncIterator[PcmF32]:
        """Speak one text segment: yields PCM chunks (float32, mono, ``engine.sample_rate``)
        as soon as each is ready and returns when the segment is complete.

        Segments of one stream are synthesised one after another: the caller does not call
        ``synthesize`` again before the previous iterator is exhausted or the stream is
        cancelled. Raises :class:`EngineError` on failure. After :meth:`cancel` the iterator
        stops (returns) at the next chunk boundary without raising.
        """

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop all work for this stream as soon as possible (barge-in). Idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the stream's resources (slots, history). Idempotent; implies cancel."""


class Engine(abc.ABC):
    """A loaded model with its worker threads."""

    name: str
    sample_rate: int

    @abc.abstractmethod
    def voices(self) -> list[VoiceInfo]: ...

    @property
    @abc.abstractmethod
    def default_voice(self) -> str: ...

    @abc.abstractmethod
    async def start(self) -> None:
        """Load weights, start workers and warm up; the server is ready after this returns."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop workers; in-flight streams end."""

    @abc.abstractmethod
    def open_stream(self, voice: str, options: SynthesisOptions) -> EngineStream:
        """Open a stream for ``voice``. Raises :class:`UnknownVoiceError` or
        :class:`OverloadedError` at once; never blocks."""

    def healthy(self) -> bool:
        """False once a worker thread has died: the process should stop being ready."""
        return True
