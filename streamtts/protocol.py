"""The native WebSocket protocol (``/v1/stream``): parse, validate and serialise messages.

No I/O here. Every way a client message can be wrong maps to one documented error code
(docs/protocol.md); parsing never raises anything but :class:`ProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from streamtts.audio import MAX_SAMPLE_RATE_HZ, MIN_SAMPLE_RATE_HZ, SUPPORTED_ENCODINGS
from streamtts.options import OptionError, SynthesisOptions, parse_options

MAX_CONTEXT_ID_BYTES = 255  # the binary audio frame prefix stores the id length in one byte
DEFAULT_ENCODING = "pcm_s16le"
DEFAULT_SAMPLE_RATE_HZ = 24_000


class ErrorCode(StrEnum):
    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"
    UNKNOWN_TYPE = "unknown_type"
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"
    UNSUPPORTED_FORMAT = "unsupported_format"
    BINARY_NOT_SUPPORTED = "binary_not_supported"
    MESSAGE_TOO_BIG = "message_too_big"
    UNKNOWN_CONTEXT = "unknown_context"
    CONTEXT_EXISTS = "context_exists"
    CONTEXT_ENDED = "context_ended"
    TOO_MANY_CONTEXTS = "too_many_contexts"
    TEXT_TOO_LONG = "text_too_long"
    UNKNOWN_VOICE = "unknown_voice"
    OVERLOADED = "overloaded"
    SLOW_CONSUMER = "slow_consumer"
    INTERNAL = "internal"


class CloseCode:
    NORMAL = 1000
    GOING_AWAY = 1001  # the server is shutting down
    POLICY = 1008
    TOO_BIG = 1009
    INTERNAL = 1011
    OVERLOADED = 1013


class ProtocolError(Exception):
    def __init__(self, code: ErrorCode, message: str, context: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.context = context


@dataclass(frozen=True)
class AudioFormat:
    """One context's audio: a raw encoding of ``streamtts.audio.SUPPORTED_ENCODINGS`` (all this
    protocol offers) or, for the compatibility protocols, a stream of ``STREAM_CONTAINERS``
    (mp3) at ``bit_rate_bps``."""

    encoding: str = DEFAULT_ENCODING
    sample_rate: int = DEFAULT_SAMPLE_RATE_HZ
    bit_rate_bps: int | None = None


@dataclass(frozen=True)
class StartMessage:
    context: str
    voice: str | None = None
    format: AudioFormat = AudioFormat()
    options: SynthesisOptions = SynthesisOptions()
    # How long this context's incomplete text may wait (a protocol's buffering hint, e.g.
    # Cartesia's max_buffer_delay_ms); the server's own setting when smaller or unset.
    max_buffer_delay_ms: float | None = None


@dataclass(frozen=True)
class TextMessage:
    context: str
    text: str


@dataclass(frozen=True)
class FlushMessage:
    context: str


@dataclass(frozen=True)
class EndMessage:
    context: str


@dataclass(frozen=True)
class CancelMessage:
    context: str


ClientMessage = StartMessage | TextMessage | FlushMessage | EndMessage | CancelMessage


def parse_client_message(raw: str | bytes, max_text_chars: int) -> ClientMessage:
    """Parse one text frame. Raises :class:`ProtocolError` with a documented code."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "a message must be a JSON object")
    kind = data.get("type")
    if kind is None:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "missing field 'type'")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "'type' must be a string")
    context = _context_id(data)
    if kind == "start":
        return _parse_start(data, context)
    if kind == "text":
        text = data.get("text")
        if text is None:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "missing field 'text'", context)
        if not isinstance(text, str):
            raise ProtocolError(ErrorCode.INVALID_FIELD, "'text' must be a string", context)
        if len(text) > max_text_chars:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"'text' has {len(text)} characters; the limit per message is {max_text_chars}",
                context,
            )
        return TextMessage(context, text)
    if kind == "flush":
        return FlushMessage(context)
    if kind == "end":
        return EndMessage(context)
    if kind == "cancel":
        return CancelMessage(context)
    raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind!r}", context)


def _context_id(data: dict[str, Any]) -> str:
    context = data.get("context")
    if context is None:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "missing field 'context'")
    if not isinstance(context, str) or not context:
        raise ProtocolError(ErrorCode.INVALID_FIELD, "'context' must be a non-empty string")
    if len(context.encode()) > MAX_CONTEXT_ID_BYTES:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"'context' must be at most {MAX_CONTEXT_ID_BYTES} bytes"
        )
    return context


def _parse_start(data: dict[str, Any], context: str) -> StartMessage:
    voice = data.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "'voice' must be a string", context)
    return StartMessage(
        context=context,
        voice=voice,
        format=_parse_format(data.get("format"), context),
        options=_parse_options(data.get("options"), context),
    )


def _parse_format(raw: Any, context: str) -> AudioFormat:
    if raw is None:
        return AudioFormat()
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "'format' must be an object", context)
    encoding = raw.get("encoding", DEFAULT_ENCODING)
    rate = raw.get("sample_rate", DEFAULT_SAMPLE_RATE_HZ)
    if not isinstance(encoding, str):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "'format.encoding' must be a string", context)
    if encoding not in SUPPORTED_ENCODINGS:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_FORMAT,
            f"encoding {encoding!r} is not supported; use one of {', '.join(SUPPORTED_ENCODINGS)}",
            context,
        )
    if not isinstance(rate, int) or isinstance(rate, bool):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, "'format.sample_rate' must be an integer", context
        )
    if not MIN_SAMPLE_RATE_HZ <= rate <= MAX_SAMPLE_RATE_HZ:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_FORMAT,
            f"sample_rate {rate} is outside {MIN_SAMPLE_RATE_HZ}..{MAX_SAMPLE_RATE_HZ} Hz",
            context,
        )
    return AudioFormat(encoding, rate)


def _parse_options(raw: Any, context: str) -> SynthesisOptions:
    """``start.options``, validated by the option table (streamtts.options)."""
    if raw is None:
        return SynthesisOptions()
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "'options' must be an object", context)
    try:
        return parse_options(raw)
    except OptionError as exc:
        raise ProtocolError(ErrorCode.INVALID_FIELD, exc.message, context) from None


# ---- server -> client -----------------------------------------------------------------------


def dumps(message: dict[str, Any]) -> str:
    return orjson.dumps(message).decode()


def started(context: str, fmt: AudioFormat) -> dict[str, Any]:
    return {
        "type": "started",
        "context": context,
        "sample_rate": fmt.sample_rate,
        "encoding": fmt.encoding,
        "channels": 1,
    }


def segment(context: str, text: str, start_ms: float, end_ms: float) -> dict[str, Any]:
    return {
        "type": "segment",
        "context": context,
        "text": text,
        "start_ms": round(start_ms, 1),
        "end_ms": round(end_ms, 1),
    }


def flushed(context: str) -> dict[str, Any]:
    return {"type": "flushed", "context": context}


def done(context: str, reason: str, stats: dict[str, float | None]) -> dict[str, Any]:
    return {"type": "done", "context": context, "reason": reason, "stats": stats}


def error(code: ErrorCode | str, message: str, context: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "error", "code": str(code), "message": message}
    if context is not None:
        out["context"] = context
    return out


def audio_frame(context: str, payload: bytes) -> bytes:
    """Binary frame: ``u8 n`` + ``n`` bytes of UTF-8 context id + audio payload."""
    prefix = context.encode()
    return bytes((len(prefix),)) + prefix + payload


def split_audio_frame(frame: bytes) -> tuple[str, bytes]:
    """Inverse of :func:`audio_frame` (for clients and tests)."""
    n = frame[0]
    return frame[1 : 1 + n].decode(), frame[1 + n :]
