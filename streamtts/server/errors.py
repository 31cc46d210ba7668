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
    UnsupportedReferenceError,
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
    if isinstance(exc, UnsupportedReferenceError):
        return WireError(ErrorCode.INVALID_FIELD, 400, message, "references")
    if isinstance(exc, EngineNotReadyError):
        return WireError(ErrorCode.INTERNAL, 503, message)
    return WireError(ErrorCode.INTERNAL, 500, message)
