"""Engine errors to wire errors, for every interface, in one place.

Each engine error type has one native error code (``streamtts.protocol.ErrorCode``) and one
HTTP status; the compatibility protocols translate the code into their own vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamtts.engine.base import (
    EngineError,
    EngineNotReadyError,
    InvalidOptionError,
    OverloadedError,
    UnknownVoiceError,
)
from streamtts.protocol import ErrorCode


@dataclass(frozen=True)
class WireError:
    code: ErrorCode
    http_status: int
    message: str
    param: str | None = None  # the request field at fault (OpenAI's ``param``)


def wire_error(exc: EngineError) -> WireError:
    message = str(exc)
    if isinstance(exc, UnknownVoiceError):
        return WireError(ErrorCode.UNKNOWN_VOICE, 400, message, "voice")
    if isinstance(exc, OverloadedError):
        return WireError(ErrorCode.OVERLOADED, 429, message)
    if isinstance(exc, InvalidOptionError):
        return WireError(ErrorCode.INVALID_FIELD, 400, message, exc.option)
    if isinstance(exc, EngineNotReadyError):
        return WireError(ErrorCode.INTERNAL, 503, message)
    return WireError(ErrorCode.INTERNAL, 500, message)


_HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.OVERLOADED: 429,
    ErrorCode.INTERNAL: 500,
}


def http_status(code: ErrorCode) -> int:
    """The HTTP status of a native error code (protocols that speak in statuses): 429 for
    ``overloaded``, 500 for ``internal``, 400 for every fault of the request."""
    return _HTTP_STATUS.get(code, 400)
