"""The native protocol (``GET /v1/stream``, docs/protocol.md) as a dialect: its messages are the
session core's own, so translating is parsing (``streamtts.protocol``) and serialising."""

from __future__ import annotations

from streamtts.protocol import (
    AudioFormat,
    CloseCode,
    ErrorCode,
    ProtocolError,
    audio_frame,
    done,
    dumps,
    error,
    flushed,
    parse_client_message,
    segment,
    started,
)
from streamtts.server.dialects.base import (
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

_REFUSAL_CLOSE_CODES = {
    RefusalCause.UNAUTHORIZED: CloseCode.POLICY,
    RefusalCause.ORIGIN: CloseCode.POLICY,
    RefusalCause.OVERLOADED: CloseCode.OVERLOADED,
    RefusalCause.SHUTTING_DOWN: CloseCode.GOING_AWAY,
}


class NativeDialect(Dialect):
    name = "native"

    def __init__(self, max_text_chars: int) -> None:
        self._max_text_chars = max_text_chars

    @classmethod
    def refusal(cls, cause: RefusalCause, message: str) -> Refusal:
        return Refusal(_REFUSAL_CLOSE_CODES[cause], message)

    def decode(self, frame: str | bytes) -> list[Action]:
        if isinstance(frame, bytes):
            return [
                Reject(
                    ErrorCode.BINARY_NOT_SUPPORTED,
                    "binary frames are not accepted from clients; send JSON text frames",
                )
            ]
        try:
            return [parse_client_message(frame, self._max_text_chars)]
        except ProtocolError as exc:
            return [Reject(exc.code, exc.message, exc.context)]

    def rejected(self, code: ErrorCode, message: str, context: str | None) -> list[RejectionOutput]:
        return [Reply(dumps(error(code, message, context)))]

    def started(self, context: str, fmt: AudioFormat) -> list[Output]:
        return [Reply(dumps(started(context, fmt)))]

    def audio(self, context: str, payload: bytes) -> bytes:
        return audio_frame(context, payload)

    def segment(self, context: str, text: str, start_ms: float, end_ms: float) -> list[Output]:
        return [Reply(dumps(segment(context, text, start_ms, end_ms)))]

    def flushed(self, context: str) -> list[Output]:
        return [Reply(dumps(flushed(context)))]

    def done(self, context: str, reason: str, stats: Stats) -> list[Output]:
        return [Reply(dumps(done(context, reason, dict(stats))))]

    def failed(self, context: str, code: ErrorCode, message: str) -> list[Output]:
        return [Reply(dumps(error(code, message, context)))]

    def idle(self) -> list[Output]:
        return [Close(CloseCode.POLICY, "idle timeout")]
