"""ElevenLabs' text-to-speech WebSockets, as its clients use them (docs/protocol.md):

- ``GET /v1/text-to-speech/{voice_id}/stream-input`` — one utterance per socket (the
  ``elevenlabs`` SDK's ``convert_realtime``): an opening message, text messages, ``{"text": ""}``
  to end; audio as base64 in ``audio``, then ``{"isFinal": true}`` and a close with 1000.
- ``GET /v1/text-to-speech/{voice_id}/multi-stream-input`` — contexts on one socket (Pipecat,
  LiveKit): ``context_id`` on every message, ``flush``, ``close_context``, ``close_socket``;
  answers carry camelCase ``contextId`` and ``isFinal: true`` ends each context.

Barge-in: a ``close_context`` with no ``flush`` since the context's last text stops it at once
(the engine stream is cancelled, its queued audio dropped) and answers ``isFinal``; after a
``flush`` it lets the audio finish first (what Pipecat and LiveKit send at the end of a turn).

Errors are ``{"message", "error"}`` objects (``error`` is the native code; ``contextId`` when
they concern a context). A bad message leaves the socket and the other contexts as they were;
what makes the socket unusable (the URL, the key, overload, shutdown, a failed stream-input
utterance, the inactivity timeout) also carries ``"code"``, the close code that follows.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from streamtts.options import OptionError, SynthesisOptions, parse_options
from streamtts.protocol import (
    AudioFormat,
    CancelMessage,
    CloseCode,
    EndMessage,
    ErrorCode,
    FlushMessage,
    ProtocolError,
    StartMessage,
    TextMessage,
)
from streamtts.server.dialects.base import (
    REFUSAL_ERRORS,
    Action,
    Close,
    Dialect,
    Output,
    Refusal,
    RefusalCause,
    Reject,
    RejectionOutput,
    Reply,
    Stats,
)
from streamtts.server.dialects.fields import Fields, load_object
from streamtts.server.dialects.text import join_piece
from streamtts.session import DEFAULT_VOICE_ALIAS

DEFAULT_OUTPUT_FORMAT: Final = "mp3_44100_128"  # the SDK's default
PCM_RATES_HZ: Final = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
# (sample rate in Hz, bit rate in kb/s) of the vendor's mp3_* formats
MP3_FORMATS: Final = {(22050, 32), *((44100, kbps) for kbps in (32, 64, 96, 128, 192))}
_MP3: Final = re.compile(r"mp3_(\d+)_(\d+)")
_PCM: Final = re.compile(r"pcm_(\d+)")

# inactivity_timeout (seconds): the vendor's default and maximum.
DEFAULT_INACTIVITY_TIMEOUT_S: Final = 20
MAX_INACTIVITY_TIMEOUT_S: Final = 180
MAX_SEED: Final = 4_294_967_295
CHUNK_LENGTH_MIN: Final = 50
CHUNK_LENGTH_MAX: Final = 500

# voice_settings this server's voices have no control for: accepted at the vendor's default.
VOICE_SETTING_DEFAULTS: Final[dict[str, float | bool]] = {
    "stability": 0.5,
    "similarity_boost": 0.75,
    "style": 0.0,
    "use_speaker_boost": True,
}
STREAM_INPUT_CONTEXT: Final = "stream-input"  # the one context of a stream-input socket


def parse_output_format(name: str) -> AudioFormat:
    """An ``output_format`` name as a context's audio format; ``ValueError`` saying what is
    offered when it is not."""
    if name == "ulaw_8000":
        return AudioFormat("mulaw", 8000)
    if name == "alaw_8000":
        return AudioFormat("alaw", 8000)
    if (m := _PCM.fullmatch(name)) and int(m.group(1)) in PCM_RATES_HZ:
        return AudioFormat("pcm_s16le", int(m.group(1)))
    if (m := _MP3.fullmatch(name)) and (int(m.group(1)), int(m.group(2))) in MP3_FORMATS:
        return AudioFormat("mp3", int(m.group(1)), int(m.group(2)) * 1000)
    raise ValueError(
        f"output_format {name!r} is not offered; use pcm_<rate> "
        f"({', '.join(str(r) for r in PCM_RATES_HZ)}), ulaw_8000, alaw_8000 or one of "
        + ", ".join(f"mp3_{r}_{k}" for r, k in sorted(MP3_FORMATS))
    )


@dataclass(frozen=True)
class EndpointQuery:
    """What the URL asks for, checked once when the socket opens."""

    format: AudioFormat
    auto_mode: bool
    inactivity_timeout_s: int
    seed: int | None


def parse_query(query: Mapping[str, str]) -> EndpointQuery:
    """The query parameters the clients send. ``model_id``, ``language_code``,
    ``enable_logging``, ``sync_alignment`` and ``optimize_streaming_latency`` change nothing
    about the audio (docs/protocol.md); what this server cannot do is refused, never ignored.
    Raises :class:`ProtocolError`."""
    try:
        fmt = parse_output_format(query.get("output_format", DEFAULT_OUTPUT_FORMAT))
    except ValueError as exc:
        raise ProtocolError(ErrorCode.UNSUPPORTED_FORMAT, str(exc)) from None
    flags = {
        name: _query_bool(query, name)
        for name in ("auto_mode", "sync_alignment", "enable_logging", "enable_ssml_parsing")
    }
    if flags["enable_ssml_parsing"]:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            "enable_ssml_parsing=true is not supported: this server speaks SSML tags as text; "
            "leave it unset or false",
        )
    normalization = query.get("apply_text_normalization", "auto")
    if normalization != "auto":
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"apply_text_normalization={normalization!r} is not supported: the voice's own "
            "text normalisation always runs; leave it unset or 'auto'",
        )
    return EndpointQuery(
        format=fmt,
        auto_mode=bool(flags["auto_mode"]),
        inactivity_timeout_s=_query_int(
            query, "inactivity_timeout", 1, MAX_INACTIVITY_TIMEOUT_S, DEFAULT_INACTIVITY_TIMEOUT_S
        ),
        seed=_query_int(query, "seed", 0, MAX_SEED, None),
    )


def _query_bool(query: Mapping[str, str], name: str) -> bool | None:
    raw = query.get(name)
    if raw is None:
        return None
    lowered = raw.lower()
    if lowered not in ("true", "false"):
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"'{name}' must be true or false")
    return lowered == "true"


def _query_int(
    query: Mapping[str, str], name: str, low: int, high: int, default: int | None
) -> Any:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"'{name}' must be an integer from {low} to {high}"
        )
    return int(raw)


@dataclass
class _Context:
    voice_settings: Any  # as sent in the context's first message (later ones must equal it)
    tail: str = ""  # the end of the text so far, to join the next piece to
    text_since_flush: bool = False  # a close_context now is a barge-in
    closing: bool = False  # close_context (or the end of input) was sent


class ElevenLabsDialect(Dialect):
    """``multi`` selects multi-stream-input; otherwise stream-input."""

    name = "elevenlabs"
    idle_while_open = True  # the vendor's timeout counts input, not open contexts

    def __init__(
        self,
        voice_id: str,
        query: Mapping[str, str],
        voices: Container[str],
        max_text_chars: int,
        multi: bool,
    ) -> None:
        self._voice_id = voice_id
        self._query = query
        self._voices = voices
        self._max_text_chars = max_text_chars
        self.multi = multi
        self._endpoint: EndpointQuery | None = None
        self._contexts: dict[str, _Context] = {}
        self._input_ended = False  # stream-input: {"text": ""} was sent
        self._closing_socket = False  # multi-stream-input: close_socket was sent
        self.idle_timeout_s = float(DEFAULT_INACTIVITY_TIMEOUT_S)

    @classmethod
    def refusal(cls, cause: RefusalCause, message: str) -> Refusal:
        code = {
            RefusalCause.UNAUTHORIZED: CloseCode.POLICY,
            RefusalCause.ORIGIN: CloseCode.POLICY,
            RefusalCause.OVERLOADED: CloseCode.OVERLOADED,
            RefusalCause.SHUTTING_DOWN: CloseCode.GOING_AWAY,
        }[cause]
        return Refusal(code, message, (_fatal(REFUSAL_ERRORS[cause], message, code),))

    # ---- in ----

    def opening(self) -> list[Action]:
        try:
            self._endpoint = parse_query(self._query)
        except ProtocolError as exc:
            return [*self._fatal_now(exc.code, exc.message)]
        if self._voice_id != DEFAULT_VOICE_ALIAS and self._voice_id not in self._voices:
            message = f"unknown voice {self._voice_id!r}; GET /v1/voices lists the voices"
            return [*self._fatal_now(ErrorCode.UNKNOWN_VOICE, message)]
        self.idle_timeout_s = float(self._endpoint.inactivity_timeout_s)
        return []

    def decode(self, frame: str | bytes) -> list[Action]:
        if isinstance(frame, bytes):
            return [
                Reject(ErrorCode.BINARY_NOT_SUPPORTED, "send JSON text frames, not binary ones")
            ]
        try:
            data = load_object(frame)
            if self.multi:
                return self._decode_multi(data)
            return self._decode_single(data)
        except ProtocolError as exc:
            return [Reject(exc.code, exc.message, exc.context)]

    def _decode_single(self, data: dict[str, Any]) -> list[Action]:
        context = STREAM_INPUT_CONTEXT
        fields = Fields(data)
        fields.string("xi-api-key")  # keys are read from the handshake only (docs/protocol.md)
        fields.string("authorization")
        text = self._text(fields)
        flush = fields.boolean("flush")
        fields.boolean("try_trigger_generation")  # a legacy latency hint (docs/protocol.md)
        if self._input_ended:
            raise ProtocolError(
                ErrorCode.CONTEXT_ENDED, 'the input has ended ({"text": ""} was sent)'
            )
        actions: list[Action] = []
        state = self._contexts.get(context)
        if state is None:
            if text is None:
                raise fields.missing("text")
            actions.append(self._start(context, fields))
            state = self._contexts[context]
        else:
            self._check_repeated_settings(state, fields)
        if text == "":
            self._input_ended = True
            state.closing = True
            return [*actions, EndMessage(context)]
        return actions + self._text_and_flush(context, state, text or "", flush)

    def _decode_multi(self, data: dict[str, Any]) -> list[Action]:
        fields = Fields(data)
        if fields.boolean("close_socket"):
            return self._close_socket()
        if self._closing_socket:
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE, "the socket is closing (close_socket was sent)"
            )
        if "context_id" not in fields:
            text = self._text(fields)
            if not text or text.isspace():
                return []  # a keepalive
            raise fields.missing("context_id")
        context = fields.context_id("context_id")
        fields = Fields(data, context)
        text = self._text(fields)
        flush = fields.boolean("flush")
        close = fields.boolean("close_context")
        state = self._contexts.get(context)
        if state is None:
            if close and not text:
                # Every closed context gets its isFinal, even one this server does not know.
                return [Reply(_dumps({"isFinal": True, "contextId": context}))]
            if not text:
                if flush:
                    raise ProtocolError(
                        ErrorCode.UNKNOWN_CONTEXT,
                        f"no open context {context!r}; send its text first",
                        context,
                    )
                return []  # a keepalive for a context that has no text yet
            actions: list[Action] = [self._start(context, fields)]
            state = self._contexts[context]
        else:
            self._check_repeated_settings(state, fields)
            actions = []
            if state.closing:
                if not text and not flush and not close:
                    return []  # a keepalive
                if close:
                    return []  # its isFinal follows when its audio is done
                raise ProtocolError(
                    ErrorCode.CONTEXT_ENDED,
                    f"context {context!r} was closed; no more text or flush is accepted",
                    context,
                )
        if text or flush:
            actions += self._text_and_flush(context, state, text or "", flush)
        if close:
            state.closing = True
            # No flush since the last text: the listener interrupted (barge-in).
            stop = CancelMessage(context) if state.text_since_flush else EndMessage(context)
            actions.append(stop)
        return actions

    def _text(self, fields: Fields) -> str | None:
        text = fields.string("text")
        if text is not None and len(text) > self._max_text_chars:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"'text' has {len(text)} characters; the limit per message is "
                f"{self._max_text_chars}",
                fields.context,
            )
        return text

    def _start(self, context: str, fields: Fields) -> StartMessage:
        endpoint = self._endpoint
        assert endpoint is not None, "opening() runs first"
        options = _options(fields, endpoint.seed)
        _check_generation_config(fields.object("generation_config"))
        if fields.raw("pronunciation_dictionary_locators") not in (None, []):
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                "pronunciation dictionaries are not supported; leave "
                "pronunciation_dictionary_locators unset",
                context,
            )
        self._contexts[context] = _Context(fields.raw("voice_settings"))
        return StartMessage(context, self._voice_id, endpoint.format, options)

    def _check_repeated_settings(self, state: _Context, fields: Fields) -> None:
        settings = fields.raw("voice_settings")
        if settings is not None and settings != state.voice_settings:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                "voice_settings can only be set by a context's first message",
                fields.context,
            )
        _check_generation_config(fields.object("generation_config"))

    def _text_and_flush(
        self, context: str, state: _Context, text: str, flush: bool
    ) -> list[Action]:
        actions: list[Action] = []
        if text and (state.tail or not text.isspace()):
            piece = join_piece(state.tail, text)
            state.tail = (state.tail + piece)[-8:]
            actions.append(TextMessage(context, piece))
            if not text.isspace():
                state.text_since_flush = True
                assert self._endpoint is not None
                if self._endpoint.auto_mode and not flush:
                    # auto_mode: every message is a complete piece; speak it now.
                    actions.append(FlushMessage(context))
        if flush:
            state.text_since_flush = False
            actions.append(FlushMessage(context))
        return actions

    def _close_socket(self) -> list[Action]:
        """Contexts already flushed finish first; the others stop now. Then close with 1000."""
        self._closing_socket = True
        actions: list[Action] = []
        for context, state in self._contexts.items():
            if not state.closing:
                state.closing = True
                stop = CancelMessage(context) if state.text_since_flush else EndMessage(context)
                actions.append(stop)
        if not self._contexts:
            actions.append(Close(CloseCode.NORMAL))
        return actions

    # ---- refusals ----

    def rejected(self, code: ErrorCode, message: str, context: str | None) -> list[RejectionOutput]:
        if not self.multi and STREAM_INPUT_CONTEXT not in self._contexts:
            return [*self._fatal_now(code, message)]  # a bad opening message
        body: dict[str, object] = {"message": message, "error": str(code)}
        if self.multi and context is not None:
            body["contextId"] = context
        return [Reply(_dumps(body))]

    def start_refused(self, context: str, code: ErrorCode, message: str) -> list[RejectionOutput]:
        self._contexts.pop(context, None)
        if not self.multi:
            close = CloseCode.OVERLOADED if code is ErrorCode.OVERLOADED else CloseCode.POLICY
            return [Reply(_fatal(str(code), message, close)), Close(close, message[:100])]
        error = {"message": message, "error": str(code), "contextId": context}
        return [Reply(_dumps(error)), Reply(_dumps({"isFinal": True, "contextId": context}))]

    def _fatal_now(self, code: ErrorCode, message: str) -> list[Reply | Close]:
        return [
            Reply(_fatal(str(code), message, CloseCode.POLICY)),
            Close(CloseCode.POLICY, message[:100]),
        ]

    # ---- out ----

    def started(self, context: str, fmt: AudioFormat) -> list[Output]:
        return []

    def audio(self, context: str, payload: bytes) -> str:
        body: dict[str, object] = {"audio": base64.b64encode(payload).decode(), "isFinal": False}
        if self.multi:
            body["contextId"] = context
        return _dumps(body)

    def segment(self, context: str, text: str, start_ms: float, end_ms: float) -> list[Output]:
        return []  # no character timings: alignment is not sent (docs/protocol.md)

    def flushed(self, context: str) -> list[Output]:
        return []

    def failed(self, context: str, code: ErrorCode, message: str) -> list[Output]:
        if not self.multi:
            close = CloseCode.INTERNAL if code is ErrorCode.INTERNAL else CloseCode.POLICY
            return [Reply(_fatal(str(code), message, close)), Close(close, message[:100])]
        return [Reply(_dumps({"message": message, "error": str(code), "contextId": context}))]

    def done(self, context: str, reason: str, stats: Stats) -> list[Output]:
        self._contexts.pop(context, None)
        if reason == "shutdown":
            message = "the server is shutting down; reconnect to another instance"
            if not self.multi:
                return [Reply(_fatal("shutting_down", message, CloseCode.GOING_AWAY))]
            body = {"message": message, "error": "shutting_down", "contextId": context}
            return [Reply(_dumps(body))]
        if not self.multi:
            if reason != "end":
                return []  # failed() has closed the socket
            return [Reply(_dumps({"isFinal": True})), Close(CloseCode.NORMAL)]
        outputs: list[Output] = [Reply(_dumps({"isFinal": True, "contextId": context}))]
        if self._closing_socket and not self._contexts:
            outputs.append(Close(CloseCode.NORMAL))
        return outputs

    def idle(self) -> list[Output]:
        message = (
            f"Have not received a new text input within the timeout of {self.idle_timeout_s} "
            "seconds. Streaming input terminated."
        )
        return [
            Reply(_fatal("input_timeout_exceeded", message, CloseCode.POLICY)),
            Close(CloseCode.POLICY, "input timeout exceeded"),
        ]


def _options(fields: Fields, seed: int | None) -> SynthesisOptions:
    """``voice_settings`` (``speed`` is the speed option) and the URL's ``seed``, through the
    option table; settings the voices cannot follow are refused unless at their default."""
    raw: dict[str, object] = {}
    settings = fields.object("voice_settings")
    if settings is not None:
        for name, default in VOICE_SETTING_DEFAULTS.items():
            value = settings.raw(name)
            if value is not None and value != default:
                raise ProtocolError(
                    ErrorCode.INVALID_FIELD,
                    f"voice_settings.{name} is not supported by this server's voices (only "
                    f"speed); leave it unset or at {orjson.dumps(default).decode()}",
                    fields.context,
                )
        raw["speed"] = settings.raw("speed")
    raw["seed"] = seed
    try:
        return parse_options(raw)
    except OptionError as exc:
        raise ProtocolError(ErrorCode.INVALID_FIELD, exc.message, fields.context) from None


def _check_generation_config(config: Fields | None) -> None:
    """``chunk_length_schedule``: checked as the vendor defines it; it is a buffering hint that
    the server's own segmentation replaces (docs/protocol.md)."""
    if config is None:
        return
    schedule = config.raw("chunk_length_schedule")
    if schedule is None:
        return
    if not isinstance(schedule, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and CHUNK_LENGTH_MIN <= n <= CHUNK_LENGTH_MAX
        for n in schedule
    ):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            "'generation_config.chunk_length_schedule' must be a list of integers from "
            f"{CHUNK_LENGTH_MIN} to {CHUNK_LENGTH_MAX}",
            config.context,
        )


def _fatal(error: str, message: str, close_code: int) -> str:
    return _dumps({"message": message, "error": error, "code": close_code})


def _dumps(body: Mapping[str, object]) -> str:
    return orjson.dumps(body).decode()
