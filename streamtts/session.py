"""The per-socket session state machine: contexts, their text segmentation and lifecycle.

Pure logic, no I/O and no torch: the WebSocket shell (``streamtts.server.stream``) feeds it
parsed messages and the clock, and carries out the effects it returns, in order.

Context lifecycle::

    (absent) --start--> OPEN --end--> ENDING --(audio drained, shell reports)--> (absent)
                          \\--cancel-----------------------------------------> (absent)

A context id may be reused once its previous context is gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from streamtts.limits import Limits
from streamtts.options import SynthesisOptions
from streamtts.protocol import (
    AudioFormat,
    CancelMessage,
    ClientMessage,
    EndMessage,
    ErrorCode,
    FlushMessage,
    ProtocolError,
    StartMessage,
    TextMessage,
    error,
)
from streamtts.segmenter import SegmenterOptions, TextSegmenter

DEFAULT_VOICE_ALIAS = "default"


# ---- effects -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Send this JSON message to the client."""

    message: dict[str, object]


@dataclass(frozen=True)
class OpenContext:
    """Create the context's synthesis pipeline (engine stream, resampler, encoder), then send
    ``started``; if the engine refuses (voice, capacity), send its error and report the context
    finished instead."""

    context: str
    voice: str
    format: AudioFormat
    options: SynthesisOptions


@dataclass(frozen=True)
class QueueSegment:
    """Synthesise this text next, after what is already queued for the context."""

    context: str
    text: str


@dataclass(frozen=True)
class PrepareSegment:
    """This text is likely the context's next segment (the sentence end it ends with waits for
    the text after it): the engine may start on it now, if nothing is queued for the context.
    A hint only: what is spoken is decided by the ``QueueSegment`` effects."""

    context: str
    text: str


@dataclass(frozen=True)
class QueueFlushMark:
    """Send ``flushed`` once all audio queued before this mark has been sent."""

    context: str


@dataclass(frozen=True)
class QueueEnd:
    """Finish the queued audio, then send ``done`` with reason ``end``."""

    context: str


@dataclass(frozen=True)
class CancelContext:
    """Stop now: drop queued audio, free the engine stream, send ``done`` reason ``cancel``."""

    context: str


Effect = (
    Send | OpenContext | QueueSegment | PrepareSegment | QueueFlushMark | QueueEnd | CancelContext
)


class Phase(Enum):
    OPEN = "open"
    ENDING = "ending"


@dataclass
class _Context:
    id: str
    segmenter: TextSegmenter
    phase: Phase = Phase.OPEN
    text_chars: int = 0
    prepared: str | None = None  # the last PrepareSegment's text


class VoiceNames(Protocol):
    """The voice ids a session may open (a set, or the server's voice catalog)."""

    def __contains__(self, voice_id: object) -> bool: ...


@dataclass
class Session:
    voices: VoiceNames
    default_voice: str
    segmenter_options: SegmenterOptions
    limits: Limits = field(default_factory=Limits)
    _contexts: dict[str, _Context] = field(default_factory=dict)

    @property
    def active_contexts(self) -> int:
        return len(self._contexts)

    def handle(self, message: ClientMessage, now_ms: float) -> list[Effect]:
        """Apply one client message. Errors come back as ``Send(error)`` effects; the session
        stays usable after any of them."""
        try:
            return self._handle(message, now_ms)
        except ProtocolError as exc:
            return [Send(error(exc.code, exc.message, exc.context))]

    def poll(self, now_ms: float, busy: Collection[str] = ()) -> list[Effect]:
        """Emit text held past the maximum buffer delay, for contexts not in ``busy``.

        A busy context is still synthesising earlier segments: its listener is not waiting in
        silence, so its incomplete sentence may keep waiting for the rest of its text.
        """
        effects: list[Effect] = []
        for ctx in self._contexts.values():
            if ctx.phase is Phase.OPEN and ctx.id not in busy:
                effects += _queue(ctx.id, ctx.segmenter.poll(now_ms))
        return effects

    def next_deadline_ms(self) -> float | None:
        deadlines = [
            d
            for ctx in self._contexts.values()
            if ctx.phase is Phase.OPEN and (d := ctx.segmenter.deadline_ms()) is not None
        ]
        return min(deadlines, default=None)

    def context_finished(self, context: str) -> None:
        """The shell reports that a context's ``done`` has been sent."""
        self._contexts.pop(context, None)

    def close(self) -> list[Effect]:
        """The socket is gone: cancel every context."""
        effects: list[Effect] = [CancelContext(c) for c in self._contexts]
        self._contexts.clear()
        return effects

    # ---- message handlers ----

    def _handle(self, message: ClientMessage, now_ms: float) -> list[Effect]:
        if isinstance(message, StartMessage):
            return self._start(message)
        ctx = self._contexts.get(message.context)
        if ctx is None:
            raise ProtocolError(
                ErrorCode.UNKNOWN_CONTEXT,
                f"no open context {message.context!r}; send 'start' first",
                message.context,
            )
        if isinstance(message, CancelMessage):
            del self._contexts[ctx.id]
            return [CancelContext(ctx.id)]
        if ctx.phase is Phase.ENDING:
            raise ProtocolError(
                ErrorCode.CONTEXT_ENDED,
                f"context {ctx.id!r} has ended; no more text, flush or end is accepted",
                ctx.id,
            )
        if isinstance(message, TextMessage):
            return self._text(ctx, message.text, now_ms)
        if isinstance(message, FlushMessage):
            return [*_queue(ctx.id, ctx.segmenter.flush()), QueueFlushMark(ctx.id)]
        assert isinstance(message, EndMessage)
        ctx.phase = Phase.ENDING
        return [*_queue(ctx.id, ctx.segmenter.flush()), QueueEnd(ctx.id)]

    def _start(self, message: StartMessage) -> list[Effect]:
        if message.context in self._contexts:
            raise ProtocolError(
                ErrorCode.CONTEXT_EXISTS,
                f"context {message.context!r} is already open",
                message.context,
            )
        if len(self._contexts) >= self.limits.max_contexts_per_socket:
            raise ProtocolError(
                ErrorCode.TOO_MANY_CONTEXTS,
                f"at most {self.limits.max_contexts_per_socket} contexts may be open on one socket",
                message.context,
            )
        voice = message.voice or DEFAULT_VOICE_ALIAS
        if voice == DEFAULT_VOICE_ALIAS:
            voice = self.default_voice
        if voice not in self.voices:
            raise ProtocolError(
                ErrorCode.UNKNOWN_VOICE,
                f"unknown voice {voice!r}; GET /v1/voices lists the voices",
                message.context,
            )
        options = self.segmenter_options
        delay_ms = message.max_buffer_delay_ms
        if delay_ms is not None and 0 < delay_ms < options.max_buffer_delay_ms:
            options = dataclasses.replace(options, max_buffer_delay_ms=delay_ms)
        self._contexts[message.context] = _Context(message.context, TextSegmenter(options))
        return [OpenContext(message.context, voice, message.format, message.options)]

    def _text(self, ctx: _Context, text: str, now_ms: float) -> list[Effect]:
        if ctx.text_chars + len(text) > self.limits.max_text_per_context_chars:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"context {ctx.id!r} would exceed {self.limits.max_text_per_context_chars} "
                "characters of text; this message was not added",
                ctx.id,
            )
        ctx.text_chars += len(text)
        effects = _queue(ctx.id, ctx.segmenter.push(text, now_ms))
        likely = ctx.segmenter.likely_next()
        if likely is not None and likely != ctx.prepared:
            effects.append(PrepareSegment(ctx.id, likely))
        ctx.prepared = likely
        return effects


def _queue(context: str, segments: list[str]) -> list[Effect]:
    return [QueueSegment(context, s) for s in segments]
