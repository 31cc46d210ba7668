"""The contract between the WebSocket shell and one wire protocol (a *dialect*).

One pipeline serves every WebSocket protocol: the shell (``streamtts.server.stream``) keeps
admission tickets, the outbox, one runner per context, limits, metrics and the drain, and a
dialect translates. A dialect is I/O-free and holds only translation state:

- **in**: :meth:`Dialect.decode` turns one client frame (text or binary) into *actions* — the
  session core's messages (``StartMessage``, ``TextMessage``, ``FlushMessage``, ``EndMessage``,
  ``CancelMessage``) for the shell to apply in order, :class:`Reject` for a bad frame,
  :class:`Reply` for an answer of its own and :class:`Close` to end the socket;
- **out**: each native event of a context (``started``, audio, ``segment``, ``flushed``,
  ``done``, ``error``) becomes this protocol's frames, or nothing; so do refusals
  (:meth:`Dialect.rejected`, :meth:`Dialect.start_refused`), the idle timeout and the socket
  refusals that happen before a dialect exists (:meth:`Dialect.refusal`: auth, overload,
  shutdown).

Errors are raised in the native vocabulary (``streamtts.protocol.ErrorCode``) everywhere and
rendered by the dialect, so limits and metrics are the same for every protocol.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from streamtts.protocol import AudioFormat, CancelMessage, ClientMessage, ErrorCode


@dataclass(frozen=True)
class Reply:
    """Send this frame (text or binary) to the client, in order with everything else."""

    frame: str | bytes


@dataclass(frozen=True)
class Reject:
    """The frame was refused: render ``code`` in the protocol's words (:meth:`Dialect.rejected`).
    Nothing it asked for happens."""

    code: ErrorCode
    message: str
    context: str | None = None


@dataclass(frozen=True)
class Close:
    """Close the socket with ``code`` once everything queued before it is sent."""

    code: int
    reason: str = ""


Action = ClientMessage | Reply | Reject | Close
"""What a client frame asks of the shell."""
Output = Reply | Close
"""What an event becomes on the wire."""
RejectionOutput = Reply | Close | CancelMessage
"""What a refusal becomes: frames, and for a protocol whose errors end a context, its cancel."""


class RefusalCause(StrEnum):
    """Why a socket is turned away before it is served (also the metric's cause label)."""

    UNAUTHORIZED = "unauthorized"
    ORIGIN = "origin"
    OVERLOADED = "overloaded"
    SHUTTING_DOWN = "shutting_down"


# The error code a protocol's refusal message carries, per cause.
REFUSAL_ERRORS: dict[RefusalCause, str] = {
    RefusalCause.UNAUTHORIZED: "unauthorized",
    RefusalCause.ORIGIN: "origin_not_allowed",
    RefusalCause.OVERLOADED: "overloaded",
    RefusalCause.SHUTTING_DOWN: "shutting_down",
}


@dataclass(frozen=True)
class Refusal:
    """How a protocol turns a socket away. Where the server can answer the handshake with an
    HTTP status (the ASGI ``websocket.http.response`` extension) and ``http_status`` is set,
    that is the answer; otherwise the socket is accepted, sent ``frames`` and closed with
    ``close_code``."""

    close_code: int
    reason: str
    frames: tuple[str, ...] = ()
    http_status: int | None = None
    http_body: bytes = b""


Stats = Mapping[str, float | None]


class Dialect(abc.ABC):
    """One socket's translation between a wire protocol and the session core."""

    name: ClassVar[str]
    # Seconds without a client message before the socket is closed (:meth:`idle`); None: the
    # server's ``idle_timeout_s``. The timer runs while no context is open, or, with
    # ``idle_while_open``, while no context is synthesising.
    idle_timeout_s: float | None = None
    idle_while_open: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def refusal(cls, cause: RefusalCause, message: str) -> Refusal:
        """How this protocol answers a socket that is not served."""

    def opening(self) -> list[Action]:
        """Right after the socket is accepted: checks of the URL and the like."""
        return []

    @abc.abstractmethod
    def decode(self, frame: str | bytes) -> list[Action]:
        """One client frame, as the shell's actions (applied in order)."""

    @abc.abstractmethod
    def rejected(self, code: ErrorCode, message: str, context: str | None) -> list[RejectionOutput]:
        """A client message was refused (by this dialect or by the session)."""

    def start_refused(self, context: str, code: ErrorCode, message: str) -> list[RejectionOutput]:
        """A context could not be opened (limits, voice, options, admission, the engine)."""
        return self.rejected(code, message, context)

    # ---- a context's events ----

    def event(self, message: Mapping[str, object]) -> list[Output]:
        """A native event of a running context (``segment``, ``flushed``, ``done``, ``error``,
        as ``streamtts.protocol`` builds them), in this protocol's frames."""
        kind = message["type"]
        context = str(message["context"])
        if kind == "segment":
            return self.segment(
                context,
                str(message["text"]),
                _number(message["start_ms"]),
                _number(message["end_ms"]),
            )
        if kind == "flushed":
            return self.flushed(context)
        if kind == "done":
            stats = message["stats"]
            assert isinstance(stats, Mapping)
            return self.done(context, str(message["reason"]), stats)
        if kind == "error":
            return self.failed(context, ErrorCode(str(message["code"])), str(message["message"]))
        raise ValueError(f"not a context event: {kind!r}")

    @abc.abstractmethod
    def started(self, context: str, fmt: AudioFormat) -> list[Output]: ...

    @abc.abstractmethod
    def audio(self, context: str, payload: bytes) -> str | bytes | None:
        """One piece of the context's audio as a frame (None: nothing to send)."""

    @abc.abstractmethod
    def segment(self, context: str, text: str, start_ms: float, end_ms: float) -> list[Output]: ...

    @abc.abstractmethod
    def flushed(self, context: str) -> list[Output]: ...

    @abc.abstractmethod
    def done(self, context: str, reason: str, stats: Stats) -> list[Output]:
        """The context ended (``reason``: end, cancel, error, shutdown); nothing follows."""

    @abc.abstractmethod
    def failed(self, context: str, code: ErrorCode, message: str) -> list[Output]:
        """The context failed while running; its ``done`` (reason ``error``) follows."""

    @abc.abstractmethod
    def idle(self) -> list[Output]:
        """The socket was idle for its timeout: the goodbye (a :class:`Close` at least)."""


def _number(value: object) -> float:
    assert isinstance(value, int | float)
    return float(value)
