"""Cartesia's TTS WebSocket (``GET /tts/websocket``), as the ``cartesia`` SDK and Pipecat use it
(docs/protocol.md).

One message type drives everything: a generation request for ``context_id`` adds its
``transcript`` (creating the context on first use, with that request's ``voice`` and
``output_format``), ``flush: true`` speaks what is buffered and is answered by ``flush_done``,
``continue: false`` ends the context (its audio, then ``done``); ``{"cancel": true}`` stops a
context at once and nothing more is sent for it, not even ``done`` (the sync SDK would hand a
late frame to another context's reader). Every frame the server sends has ``type`` and
``context_id``. An error ends the context it concerns: ``error`` has ``done: true``, so nothing
follows it for that context; other contexts and the socket go on.
"""

from __future__ import annotations

import base64
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final

import orjson

from streamtts.options import TRANSPORT_FIELDS, OptionError, SynthesisOptions, parse_options
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
from streamtts.server.errors import http_status

ENCODINGS: Final = {
    "pcm_s16le": "pcm_s16le",
    "pcm_f32le": "pcm_f32le",
    "pcm_mulaw": "mulaw",
    "pcm_alaw": "alaw",
}
SAMPLE_RATES_HZ: Final = (8000, 16000, 22050, 24000, 44100, 48000)
MAX_BUFFER_DELAY_MS: Final = 5000
STATUS_PARTIAL: Final = 206  # what the vendor puts on chunk, flush_done and done
_SHUTDOWN_STATUS: Final = 503

_REFUSALS: Final = {
    RefusalCause.UNAUTHORIZED: (401, CloseCode.POLICY),
    RefusalCause.ORIGIN: (403, CloseCode.POLICY),
    RefusalCause.OVERLOADED: (429, CloseCode.OVERLOADED),
    RefusalCause.SHUTTING_DOWN: (_SHUTDOWN_STATUS, CloseCode.GOING_AWAY),
}


@dataclass(frozen=True)
class GenerationRequest:
    """One generation request, checked. ``voice``/``format``/``options``/``max_buffer_delay_ms``
    are used by a context's first request only (the vendor requires later ones to repeat them)."""

    transcript: str
    more: bool  # "continue"
    flush: bool
    voice: str | None
    format: AudioFormat | None
    options: SynthesisOptions
    max_buffer_delay_ms: int | None


def parse_request(fields: Fields, max_text_chars: int) -> GenerationRequest:
    """Raises :class:`ProtocolError`. ``model_id``, ``language`` and the timestamp flags change
    nothing about the audio; what this server cannot do is refused, never ignored."""
    transcript = fields.required_string("transcript")
    if len(transcript) > max_text_chars:
        raise ProtocolError(
            ErrorCode.TEXT_TOO_LONG,
            f"'transcript' has {len(transcript)} characters; the limit per message is "
            f"{max_text_chars}",
            fields.context,
        )
    for name in TRANSPORT_FIELDS["cartesia"]:  # change nothing, but must be well-formed
        if name in ("model_id", "language"):
            fields.string(name)
        else:
            fields.boolean(name)
    if fields.raw("pronunciation_dict_id") is not None:
        raise _unsupported(fields, "pronunciation dictionaries are not supported")
    speed = fields.string("speed")
    if speed not in (None, "normal"):
        raise _unsupported(
            fields, f"speed {speed!r} is not supported; use generation_config.speed (a number)"
        )
    return GenerationRequest(
        transcript=transcript,
        more=fields.boolean("continue"),
        flush=fields.boolean("flush"),
        voice=_voice(fields),
        format=_output_format(fields),
        options=_options(fields),
        max_buffer_delay_ms=fields.integer("max_buffer_delay_ms", 0, MAX_BUFFER_DELAY_MS),
    )


def _voice(fields: Fields) -> str | None:
    raw = fields.raw("voice")
    if raw is None or isinstance(raw, str):
        return raw
    voice = fields.object("voice")
    assert voice is not None
    mode = voice.string("mode")
    if mode not in (None, "id"):
        raise _unsupported(fields, f"voice mode {mode!r} is not supported; give a voice id")
    return voice.required_string("id")


def _output_format(fields: Fields) -> AudioFormat | None:
    fmt = fields.object("output_format")
    if fmt is None:
        return None
    container = fmt.required_string("container")
    encoding = fmt.required_string("encoding")
    rate = fmt.raw("sample_rate")
    if container != "raw":
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_FORMAT,
            f"container {container!r} is not offered on the WebSocket; use 'raw'",
            fields.context,
        )
    if encoding not in ENCODINGS:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_FORMAT,
            f"encoding {encoding!r} is not offered; use one of {', '.join(ENCODINGS)}",
            fields.context,
        )
    if rate is None:
        raise fmt.missing("sample_rate")
    if isinstance(rate, bool) or rate not in SAMPLE_RATES_HZ:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_FORMAT,
            f"sample_rate {rate!r} is not offered; use one of "
            f"{', '.join(str(r) for r in SAMPLE_RATES_HZ)}",
            fields.context,
        )
    return AudioFormat(ENCODINGS[encoding], int(rate))


def _options(fields: Fields) -> SynthesisOptions:
    config = fields.object("generation_config")
    if config is None:
        return SynthesisOptions()
    volume = config.number("volume")
    if volume not in (None, 1.0):
        raise _unsupported(fields, "generation_config.volume is not supported; leave it at 1")
    if config.raw("emotion") not in (None, "", []):
        raise _unsupported(fields, "generation_config.emotion is not supported; leave it unset")
    try:
        return parse_options({"speed": config.number("speed")})
    except OptionError as exc:
        raise ProtocolError(ErrorCode.INVALID_FIELD, exc.message, fields.context) from None


def _unsupported(fields: Fields, message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_FIELD, message, fields.context)


@dataclass
class _Context:
    flush_each: bool  # max_buffer_delay_ms 0: speak every transcript as it arrives
    tail: str = ""
    ending: bool = False  # continue: false was sent
    silent: bool = False  # cancelled, or ended by an error: nothing more is sent for it
    marks: deque[bool] = field(default_factory=deque)  # flushes in flight: True = the client's
    flush_id: int = 0  # flush_done sent so far


class CartesiaDialect(Dialect):
    name = "cartesia"

    def __init__(self, max_text_chars: int) -> None:
        self._max_text_chars = max_text_chars
        self._contexts: dict[str, _Context] = {}

    @classmethod
    def refusal(cls, cause: RefusalCause, message: str) -> Refusal:
        status, close_code = _REFUSALS[cause]
        body = _error_body(None, status, REFUSAL_ERRORS[cause], message)
        return Refusal(
            close_code,
            message,
            frames=(_dumps(body),),
            http_status=status,
            http_body=orjson.dumps(body),
        )

    # ---- in ----

    def decode(self, frame: str | bytes) -> list[Action]:
        if isinstance(frame, bytes):
            return [Reject(ErrorCode.BINARY_NOT_SUPPORTED, "send JSON text frames, not binary")]
        try:
            return self._decode(load_object(frame))
        except ProtocolError as exc:
            return [Reject(exc.code, exc.message, exc.context)]

    def _decode(self, data: dict[str, object]) -> list[Action]:
        context = Fields(data).context_id("context_id")
        fields = Fields(data, context)
        state = self._contexts.get(context)
        if fields.boolean("cancel"):
            if state is None or state.silent:
                return []  # nothing to stop; the SDK waits for no answer
            state.silent = True
            return [CancelMessage(context)]
        request = parse_request(fields, self._max_text_chars)
        actions: list[Action] = []
        if state is None:
            if request.voice is None:
                raise fields.missing("voice")
            if request.format is None:
                raise fields.missing("output_format")
            delay_ms = request.max_buffer_delay_ms
            state = _Context(flush_each=delay_ms == 0)
            self._contexts[context] = state
            start = StartMessage(
                context, request.voice, request.format, request.options, delay_ms or None
            )
            actions.append(start)
        elif state.ending:
            raise ProtocolError(
                ErrorCode.CONTEXT_ENDED,
                f"context {context!r} has ended (continue: false was sent); use a new context_id",
                context,
            )
        if request.transcript:
            piece = join_piece(state.tail, request.transcript)
            state.tail = (state.tail + piece)[-8:]
            actions.append(TextMessage(context, piece))
            if state.flush_each and request.more and not request.flush:
                state.marks.append(False)
                actions.append(FlushMessage(context))
        if request.flush:
            state.marks.append(True)
            actions.append(FlushMessage(context))
        if not request.more:
            state.ending = True
            actions.append(EndMessage(context))
        return actions

    # ---- refusals ----

    def rejected(self, code: ErrorCode, message: str, context: str | None) -> list[RejectionOutput]:
        outputs: list[RejectionOutput] = [
            Reply(_dumps(_error_body(context, http_status(code), str(code), message)))
        ]
        if context is not None:
            state = self._contexts.get(context)
            if state is not None and not state.silent:
                state.silent = True  # the error said done: true
                outputs.append(CancelMessage(context))
        return outputs

    def start_refused(self, context: str, code: ErrorCode, message: str) -> list[RejectionOutput]:
        self._contexts.pop(context, None)
        return [Reply(_dumps(_error_body(context, http_status(code), str(code), message)))]

    # ---- out ----

    def started(self, context: str, fmt: AudioFormat) -> list[Output]:
        return []

    def audio(self, context: str, payload: bytes) -> str | None:
        state = self._contexts.get(context)
        if state is None or state.silent:
            return None
        body: dict[str, object] = {
            "type": "chunk",
            "context_id": context,
            "data": base64.b64encode(payload).decode(),
            "done": False,
            "status_code": STATUS_PARTIAL,
        }
        if state.flush_id:
            body["flush_id"] = state.flush_id
        return _dumps(body)

    def segment(self, context: str, text: str, start_ms: float, end_ms: float) -> list[Output]:
        return []  # no word timings: timestamps are not sent (docs/protocol.md)

    def flushed(self, context: str) -> list[Output]:
        state = self._contexts.get(context)
        if state is None or state.silent or not state.marks or not state.marks.popleft():
            return []
        state.flush_id += 1
        body = {
            "type": "flush_done",
            "context_id": context,
            "done": False,
            "flush_done": True,
            "flush_id": state.flush_id,
            "status_code": STATUS_PARTIAL,
        }
        return [Reply(_dumps(body))]

    def failed(self, context: str, code: ErrorCode, message: str) -> list[Output]:
        state = self._contexts.get(context)
        if state is None or state.silent:
            return []
        state.silent = True
        return [Reply(_dumps(_error_body(context, http_status(code), str(code), message)))]

    def done(self, context: str, reason: str, stats: Stats) -> list[Output]:
        state = self._contexts.pop(context, None)
        if state is None or state.silent:
            return []
        if reason == "shutdown":
            message = "the server is shutting down; reconnect to another instance"
            body = _error_body(context, _SHUTDOWN_STATUS, "shutting_down", message)
            return [Reply(_dumps(body))]
        body = {"type": "done", "context_id": context, "done": True, "status_code": STATUS_PARTIAL}
        return [Reply(_dumps(body))]

    def idle(self) -> list[Output]:
        return [Close(CloseCode.POLICY, "idle timeout")]


def _error_body(context: str | None, status: int, code: str, message: str) -> dict[str, object]:
    return {
        "type": "error",
        "context_id": context,
        "done": True,
        "status_code": status,
        "title": HTTPStatus(status).phrase,
        "message": message,
        "error_code": code,
    }


def _dumps(body: dict[str, object]) -> str:
    return orjson.dumps(body).decode()
