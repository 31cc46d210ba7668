"""The engine contract: what the server may ask of any engine, and nothing more.

An engine turns text segments into float32 mono PCM at its native ``sample_rate``. The server
opens one :class:`EngineStream` per context (utterance stream) and feeds it segments in order;
an engine may keep state across the segments of one stream (Fish-Speech keeps the iterative
prompt history there so the voice stays consistent).

Threading rule: every method here is called from the event loop and must return quickly, and
none may run torch (no tensor is made on the loop thread: on CUDA it would run on the loop
thread's stream, unordered with the workers'). Model work happens on the engine's own worker
threads; audio comes back through the async iterator returned by
:meth:`EngineStream.synthesize`.

Errors are typed (:class:`EngineError` and its subclasses); the server maps each type to its
wire codes in one place (``streamtts.server.errors``).
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from streamtts.options import OptionError, SynthesisOptions, refuse_unhonoured

PcmF32 = npt.NDArray[np.float32]
Codes = npt.NDArray[np.int32]

__all__ = [
    "Capacity",
    "ClonedVoice",
    "CloningNotSupportedError",
    "Codes",
    "Engine",
    "EngineError",
    "EngineNotReadyError",
    "EngineStream",
    "InvalidOptionError",
    "InvalidReferenceError",
    "OverloadedError",
    "PcmF32",
    "StreamStats",
    "SynthesisError",
    "SynthesisOptions",
    "UnknownVoiceError",
    "VoiceInfo",
]


class EngineError(Exception):
    """A refusal or failure of one stream; only the context that asked for it is affected."""


class UnknownVoiceError(EngineError):
    pass


class OverloadedError(EngineError):
    """The engine has no free capacity (e.g. no KV slot) for a new stream."""


class InvalidOptionError(EngineError):
    """An option this engine cannot honour, or an invalid value; ``option`` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


class EngineNotReadyError(EngineError):
    """The engine is not started, or has failed (its workers died)."""


class SynthesisError(EngineError):
    """A segment's synthesis failed inside the engine."""


class CloningNotSupportedError(EngineError):
    """This engine cannot speak in a voice given by a reference recording."""


class InvalidReferenceError(EngineError):
    """A reference recording the engine cannot make a voice of."""


@dataclass(frozen=True, eq=False)
class ClonedVoice:
    """A voice given by a reference recording: its transcript and the codec codes the engine
    made of the recording (:meth:`Engine.encode_reference`). ``key`` names its content (the
    engine caches its prompt under it)."""

    id: str
    text: str
    codes: Codes  # [codebooks, frames]

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.text.encode())
        digest.update(np.ascontiguousarray(self.codes, dtype=np.int32).tobytes())
        return f"{self.id}:{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class VoiceInfo:
    id: str
    name: str
    language: str
    engine: str
    description: str = ""


@dataclass(frozen=True)
class Capacity:
    """Concurrent streams the engine can hold (``None``: no fixed number), how many more it
    can take now, and how many it can keep at real time at once by what it has measured of its
    own cost (``None``: not known yet; see streamtts.scheduling)."""

    streams: int | None = None
    free: int | None = None
    realtime_streams: float | None = None


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
    sample_rate: int  # of the PCM it yields (its voice's rate)

    @abc.abstractmethod
    def synthesize(self, text: str) -> AsyncIterator[PcmF32]:
        """Speak one text segment: yields PCM chunks (float32, mono, ``engine.sample_rate``)
        as soon as each is ready and returns when the segment is complete.

        Segments of one stream are synthesised one after another: the caller does not call
        ``synthesize`` again before the previous iterator is exhausted or the stream is
        cancelled. Raises :class:`EngineError` on failure. After :meth:`cancel` the iterator
        stops (returns) at the next chunk boundary without raising.
        """

    def prepare(self, text: str) -> None:
        """A hint that ``text`` is likely the next segment: an engine may start on it now (a
        sentence whose end waits for the text after it), so that its audio is ready sooner
        when ``synthesize(text)`` comes. What ``synthesize`` yields must not depend on
        whether it did; work on a prepared text that is not synthesised next is dropped.
        Called only while no ``synthesize`` runs. By default, nothing."""
        return None

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop all work for this stream as soon as possible (barge-in). Idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the stream's resources (slots, history). Idempotent; implies cancel."""


class Engine(abc.ABC):
    """A loaded model with its worker threads."""

    # Which engine of the option table this is ("fish", "piper"): the options it honours.
    kind: ClassVar[str]
    # Whether it speaks in voices given by reference recordings (ClonedVoice).
    supports_cloning: ClassVar[bool] = False
    name: str

    @property
    @abc.abstractmethod
    def sample_rate(self) -> int:
        """The rate of the PCM this engine yields (known once started)."""

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

    def open_stream(self, voice: str | ClonedVoice, options: SynthesisOptions) -> EngineStream:
        """Open a stream for ``voice`` (a built-in voice id, or a cloned voice), or refuse at
        once (never blocks): :class:`InvalidOptionError` for an option this engine cannot
        honour, :class:`UnknownVoiceError`, :class:`CloningNotSupportedError`,
        :class:`OverloadedError`, :class:`EngineNotReadyError`."""
        try:
            refuse_unhonoured(options, self.kind)
        except OptionError as exc:
            raise InvalidOptionError(exc.option, exc.message) from None
        if isinstance(voice, ClonedVoice) and not self.supports_cloning:
            raise CloningNotSupportedError(f"the {self.kind} engine cannot clone voices")
        return self._open_stream(voice, options)

    @abc.abstractmethod
    def _open_stream(self, voice: str | ClonedVoice, options: SynthesisOptions) -> EngineStream:
        """:meth:`open_stream` once the options are known to be honoured."""

    async def encode_reference(self, samples: PcmF32, rate_hz: int) -> Codes:
        """The codes of a reference recording (mono float32 at ``rate_hz``), for a
        :class:`ClonedVoice`; computed on a worker thread."""
        raise CloningNotSupportedError(f"the {self.kind} engine cannot clone voices")

    def codec_id(self) -> str | None:
        """What makes this engine's reference codes (a stored voice made by another codec is
        not used); ``None`` when it does not clone."""
        return None

    def forget_voice(self, voice_id: str) -> None:
        """A cloned voice was deleted: drop what the engine keeps of it (cached prompts)."""
        return None

    async def refresh_voices(self) -> None:
        """Look again for voices the engine finds by itself (e.g. Piper models in a folder)."""
        return None

    def healthy(self) -> bool:
        """False once a worker thread has died: the process should stop being ready."""
        return True

    def capacity(self) -> Capacity:
        return Capacity()

    def describe(self) -> dict[str, Any]:
        """What runs (for ``GET /v1/models``, logs and benchmarks): at least ``engine``."""
        return {"engine": self.kind}
