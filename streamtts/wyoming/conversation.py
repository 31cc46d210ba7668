"""One Wyoming connection's requests, translated into the native session core. Pure: no I/O.

Home Assistant asks for speech in two ways (docs/protocol.md, "Wyoming"):

- plain: ``synthesize {text, voice?}`` → ``audio-start``, ``audio-chunk``..., ``audio-stop``;
- streaming: ``synthesize-start {voice?}``, ``synthesize-chunk {text}`` as an LLM writes, the
  whole text once more as ``synthesize`` (for servers without streaming: **not** spoken again),
  ``synthesize-stop`` → the same audio events, then ``synthesize-stopped``.

Each request is the one context of a fresh :class:`~streamtts.session.Session` (segmentation
with a short first segment, text limits); its effects go to the shell, which carries them out as
the native socket does (admission ticket, engine stream, ``ContextRunner``), and the shell
reports the runner's native messages (``started``, ``error``, ``done``) back here. The audio
format is one for the whole response: 16-bit mono PCM at the engine's rate.

Requests are answered one at a time, in order; events that arrive while one is in flight
(other than the streaming request's own) wait, at most :data:`MAX_WAITING_EVENTS` of them.
Every error is answered with an ``error`` event and the connection is then closed, as
wyoming-piper does: Home Assistant reads until ``audio-stop`` / ``synthesize-stopped`` and does
not look at ``error`` events, so the closed connection is how it learns that a request failed.
Event types this server does not serve are dropped, as Wyoming servers do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from streamtts.engine.base import VoiceInfo
from streamtts.limits import Limits
from streamtts.protocol import (
    AudioFormat,
    EndMessage,
    ErrorCode,
    StartMessage,
    TextMessage,
)
from streamtts.segmenter import SegmenterOptions
from streamtts.session import (
    CancelContext,
    Effect,
    OpenContext,
    PrepareSegment,
    QueueEnd,
    QueueFlushMark,
    QueueSegment,
    Send,
    Session,
)
from streamtts.wyoming.info import describe_info, voice_languages

CONTEXT_PREFIX = "wyoming-"  # each request is a context of its own: wyoming-1, wyoming-2...
SAMPLE_WIDTH_BYTES = 2  # audio-chunk payloads are pcm_s16le
CHANNELS = 1
ENCODING = "pcm_s16le"
MAX_WAITING_EVENTS = 16
SHUTTING_DOWN = "shutting_down"


@dataclass(frozen=True)
class SendEvent:
    event: Event


@dataclass(frozen=True)
class CloseConnection:
    """Close once everything sent before is written."""


Action = (
    SendEvent
    | CloseConnection
    | OpenContext
    | QueueSegment
    | PrepareSegment
    | QueueEnd
    | CancelContext
)


class Mode(Enum):
    PLAIN = "plain"
    STREAMING = "streaming"


class RequestError(Exception):
    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message


class Conversation:
    def __init__(
        self,
        voices: Callable[[], Sequence[VoiceInfo]],
        default_voice: str,
        rate_hz: int,
        segmenter_options: SegmenterOptions,
        limits: Limits,
    ) -> None:
        self._voices = voices
        self._default_voice = default_voice
        self._format = AudioFormat(ENCODING, rate_hz)
        self._segmenter_options = segmenter_options
        self._limits = limits
        self._session: Session | None = None
        self._mode: Mode | None = None  # a response in flight
        self._ending = False  # no more text for it (plain, or after synthesize-stop)
        self._waiting: deque[Event] = deque()
        self._requests = 0
        self.context = ""  # the context of the request in flight (or of the last one)
        self._audio_ms = 0.0
        self.closed = False  # an error was answered: nothing more is done

    @property
    def busy(self) -> bool:
        return self._mode is not None

    @property
    def streaming(self) -> bool:
        """The response in flight answers a streaming request (synthesize-start)."""
        return self._mode is Mode.STREAMING

    # ---- the client's events ----

    def handle(self, event: Event, now_ms: float) -> list[Action]:
        if self.closed:
            return []
        if self._mode is not None and not self._for_open_stream(event):
            if len(self._waiting) >= MAX_WAITING_EVENTS:
                return self._fail(
                    ErrorCode.INVALID_MESSAGE,
                    f"more than {MAX_WAITING_EVENTS} events arrived while a request was being "
                    "answered; send the next request after audio-stop",
                )
            self._waiting.append(event)
            return []
        return self._dispatch_safely(event, now_ms)

    def _dispatch_safely(self, event: Event, now_ms: float) -> list[Action]:
        try:
            return self._dispatch(event, now_ms)
        except RequestError as exc:
            return self._fail(exc.code, exc.message)

    def _for_open_stream(self, event: Event) -> bool:
        """Events that belong to the streaming request in flight (until its synthesize-stop)."""
        return (
            self._mode is Mode.STREAMING
            and not self._ending
            and (
                SynthesizeChunk.is_type(event.type)
                or SynthesizeStop.is_type(event.type)
                or Synthesize.is_type(event.type)
                or SynthesizeStart.is_type(event.type)
            )
        )

    def _dispatch(self, event: Event, now_ms: float) -> list[Action]:
        kind, data = event.type, event.data
        if Describe.is_type(kind):
            return [SendEvent(describe_info(self._voices()).event())]
        if Ping.is_type(kind):
            text = data.get("text")
            return [SendEvent(Pong(text=text if isinstance(text, str) else None).event())]
        if self._mode is Mode.STREAMING:
            return self._streaming_event(kind, data, now_ms)
        if Synthesize.is_type(kind):
            return self._start(Mode.PLAIN, data, _text(data, "synthesize"), now_ms)
        if SynthesizeStart.is_type(kind):
            return self._start(Mode.STREAMING, data, None, now_ms)
        if SynthesizeChunk.is_type(kind) or SynthesizeStop.is_type(kind):
            raise RequestError(
                ErrorCode.INVALID_MESSAGE, f"'{kind}' without 'synthesize-start' before it"
            )
        return []  # not a TTS event: dropped

    def _streaming_event(self, kind: str, data: dict[str, Any], now_ms: float) -> list[Action]:
        session = self._session
        assert session is not None
        if Synthesize.is_type(kind):
            return []  # the whole text again, for servers without streaming: already spoken
        if SynthesizeStart.is_type(kind):
            raise RequestError(
                ErrorCode.INVALID_MESSAGE,
                "'synthesize-start' while a streaming request is open; send 'synthesize-stop'",
            )
        if SynthesizeChunk.is_type(kind):
            text = _text(data, "synthesize-chunk")
            limit = self._limits.max_text_per_message_chars
            if len(text) > limit:
                raise RequestError(
                    ErrorCode.TEXT_TOO_LONG,
                    f"'synthesize-chunk' has {len(text)} characters; the limit is {limit}",
                )
            return self._effects(session.handle(TextMessage(self.context, text), now_ms))
        self._ending = True  # synthesize-stop
        return self._effects(session.handle(EndMessage(self.context), now_ms))

    def _start(
        self, mode: Mode, data: dict[str, Any], text: str | None, now_ms: float
    ) -> list[Action]:
        voice = self._voice(data.get("voice"))
        text_format = data.get("text_format")
        if text_format not in (None, "text"):
            raise RequestError(
                ErrorCode.INVALID_FIELD,
                f"text_format {text_format!r} is not supported; send plain text",
            )
        voices = self._voices()
        session = Session(
            voices=frozenset(v.id for v in voices),
            default_voice=self._default_voice,
            segmenter_options=self._segmenter_options,
            limits=self._limits,
        )
        self._session, self._mode, self._ending, self._audio_ms = session, mode, False, 0.0
        self._requests += 1
        self.context = context = f"{CONTEXT_PREFIX}{self._requests}"
        effects = session.handle(StartMessage(context, voice, self._format), now_ms)
        if text is not None:
            self._ending = True
            effects += session.handle(TextMessage(context, text), now_ms)
            effects += session.handle(EndMessage(context), now_ms)
        return self._effects(effects)

    def _voice(self, raw: Any) -> str | None:
        """The voice id a ``voice {name?, language?, speaker?}`` asks for (None: the default)."""
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise RequestError(ErrorCode.INVALID_FIELD, "'voice' must be an object")
        name, language, speaker = raw.get("name"), raw.get("language"), raw.get("speaker")
        for field, value in (("name", name), ("language", language), ("speaker", speaker)):
            if value is not None and not isinstance(value, str):
                raise RequestError(ErrorCode.INVALID_FIELD, f"'voice.{field}' must be a string")
        if speaker is not None:
            raise RequestError(
                ErrorCode.INVALID_FIELD,
                f"speaker {speaker!r} is not available: this server's voices have one speaker",
            )
        if name is not None:
            return str(name)  # an unknown name is refused by the session (unknown_voice)
        if language is not None:
            return self._voice_for_language(str(language))
        return None

    def _voice_for_language(self, language: str) -> str:
        """The default voice if it speaks ``language`` (``en`` matches ``en-US``), else the
        first voice with exactly that tag, else the first with its primary language."""
        wanted = _language_tag(language)
        primary = wanted.split("-")[0]
        exact: list[str] = []
        related: list[str] = []
        for voice in self._voices():
            tags = [_language_tag(t) for t in voice_languages(voice)]
            if wanted in tags:
                exact.append(voice.id)
            elif primary in (t.split("-")[0] for t in tags):
                related.append(voice.id)
        if self._default_voice in exact + related:
            return self._default_voice
        if exact or related:
            return (exact + related)[0]
        raise RequestError(ErrorCode.UNKNOWN_VOICE, f"no voice speaks {language!r}")

    # ---- what the runner reports (native messages) ----

    def on_message(self, message: dict[str, Any], now_ms: float) -> list[Action]:
        if self.closed:
            return []
        kind = message.get("type")
        if kind == "started":
            rate = int(message["sample_rate"])
            start = AudioStart(rate=rate, width=SAMPLE_WIDTH_BYTES, channels=CHANNELS, timestamp=0)
            return [SendEvent(start.event())]
        if kind == "error":
            return self._fail(str(message["code"]), str(message["message"]))
        if kind != "done":
            return []  # segment, flushed: Wyoming has no such events
        mode, reason = self._mode, message.get("reason")
        self._session, self._mode, self._ending = None, None, False
        if reason == "shutdown":
            return self._fail(SHUTTING_DOWN, "the server is shutting down")
        if reason != "end":
            self.closed = True  # error (already answered) or cancel (the connection is gone)
            return [CloseConnection()]
        actions: list[Action] = [SendEvent(AudioStop(timestamp=round(self._audio_ms)).event())]
        if mode is Mode.STREAMING:
            actions.append(SendEvent(SynthesizeStopped().event()))
        return actions + self._replay(now_ms)

    def audio(self, payload: bytes, ms: float) -> SendEvent:
        """An ``audio-chunk`` of the response in flight."""
        chunk = AudioChunk(
            rate=self._format.sample_rate,
            width=SAMPLE_WIDTH_BYTES,
            channels=CHANNELS,
            audio=payload,
            timestamp=round(self._audio_ms),
        )
        self._audio_ms += ms
        return SendEvent(chunk.event())

    def poll(self, now_ms: float, busy: bool) -> list[Action]:
        """Text held past the maximum buffer delay (streaming requests)."""
        if self._session is None or self._ending or self.closed:
            return []
        return self._effects(self._session.poll(now_ms, [self.context] if busy else []))

    def shutting_down(self) -> list[Action]:
        """The server drains and its grace is over: end the connection (the shell cancels the
        response in flight; its ``done`` reason ``shutdown`` comes back here)."""
        if self._mode is None:
            return self._fail(SHUTTING_DOWN, "the server is shutting down")
        return []

    # ---- helpers ----

    def _replay(self, now_ms: float) -> list[Action]:
        """Events that waited, in order, as far as they can be answered now: the next request
        when idle, then the events of a streaming request it opened."""
        actions: list[Action] = []
        while not self.closed:
            if self._mode is None:
                if not self._waiting:
                    break
                event = self._waiting.popleft()
            else:
                found = next((e for e in self._waiting if self._for_open_stream(e)), None)
                if found is None:
                    break
                self._waiting.remove(found)
                event = found
            actions += self._dispatch_safely(event, now_ms)
        return actions

    def _effects(self, effects: list[Effect]) -> list[Action]:
        actions: list[Action] = []
        for effect in effects:
            if isinstance(effect, Send):  # an error: nothing of this event is carried out
                message = effect.message
                return self._fail(str(message["code"]), str(message["message"]))
            if isinstance(effect, QueueFlushMark):
                continue  # Wyoming has no flush
            actions.append(effect)
        return actions

    def _fail(self, code: ErrorCode | str, message: str) -> list[Action]:
        self.closed = True
        self._waiting.clear()
        actions: list[Action] = [SendEvent(Error(text=message, code=str(code)).event())]
        if self._mode is not None and self._session is not None:
            # The response in flight stops (close() yields CancelContext effects only).
            actions += [e for e in self._session.close() if isinstance(e, CancelContext)]
        return [*actions, CloseConnection()]


def _text(data: dict[str, Any], kind: str) -> str:
    text = data.get("text")
    if text is None:
        raise RequestError(ErrorCode.MISSING_FIELD, f"'{kind}' needs a 'text'")
    if not isinstance(text, str):
        raise RequestError(ErrorCode.INVALID_FIELD, f"'{kind}.text' must be a string")
    return text


def _language_tag(language: str) -> str:
    return language.strip().replace("_", "-").lower()
