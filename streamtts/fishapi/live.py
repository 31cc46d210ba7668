"""The Fish Audio live socket's frames (``GET /v1/tts/live``): every frame, both ways, is one
binary msgpack map with an ``event``. Pure: parsing and serialising, no I/O.

Client → server: ``start {request}`` (a TTS request, ``text`` usually ``""``), ``text {text}``,
``flush``, ``stop``. Server → client: ``audio {audio: bin}`` as it is ready, then one ``finish
{reason: "stop" | "error"}`` (an error adds ``code`` and ``message``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from streamtts.fishapi.request import FishRequestError, FishTtsRequest, parse_request
from streamtts.limits import Limits
from streamtts.protocol import ErrorCode


class LiveError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class LiveStart:
    request: FishTtsRequest


@dataclass(frozen=True)
class LiveText:
    text: str


@dataclass(frozen=True)
class LiveFlush:
    pass


@dataclass(frozen=True)
class LiveStop:
    pass


LiveEvent = LiveStart | LiveText | LiveFlush | LiveStop


def parse_event(frame: bytes, limits: Limits) -> LiveEvent:
    """One client frame. Raises :class:`LiveError` with a documented code."""
    try:
        data = msgpack.unpackb(frame, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise LiveError(ErrorCode.INVALID_MESSAGE, f"a frame must be msgpack: {exc}") from None
    if not isinstance(data, Mapping):
        raise LiveError(ErrorCode.INVALID_MESSAGE, "a frame must be a msgpack map")
    event = data.get("event")
    if event is None:
        raise LiveError(ErrorCode.MISSING_FIELD, "missing field 'event'")
    if event == "start":
        return LiveStart(_start_request(data.get("request"), limits))
    if event == "text":
        text = data.get("text")
        if not isinstance(text, str):
            raise LiveError(ErrorCode.INVALID_FIELD, "'text' must be a string")
        limit = limits.max_text_per_message_chars
        if len(text) > limit:
            raise LiveError(
                ErrorCode.TEXT_TOO_LONG,
                f"'text' has {len(text)} characters; the limit per frame is {limit}",
            )
        return LiveText(text)
    if event == "flush":
        return LiveFlush()
    if event == "stop":
        return LiveStop()
    raise LiveError(ErrorCode.UNKNOWN_TYPE, f"unknown event {event!r}")


def _start_request(raw: Any, limits: Limits) -> FishTtsRequest:
    if raw is None:
        raise LiveError(ErrorCode.MISSING_FIELD, "'start' needs a 'request'")
    try:
        return parse_request(raw, limits.max_text_per_message_chars, require_text=False)
    except FishRequestError as exc:
        raise LiveError(exc.code, exc.message) from None


def audio_event(audio: bytes) -> bytes:
    return _pack({"event": "audio", "audio": audio})


def finish_event(reason: str, code: str | None = None, message: str | None = None) -> bytes:
    event: dict[str, Any] = {"event": "finish", "reason": reason}
    if code is not None:
        event["code"] = code
    if message is not None:
        event["message"] = message
    return _pack(event)


def _pack(event: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(event, use_bin_type=True)
    return packed
