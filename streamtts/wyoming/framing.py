"""Wyoming event framing, with bounds: a JSON header line, then ``data_length`` bytes of JSON
data merged over the header's ``data``, then ``payload_length`` bytes of binary payload.

The ``wyoming`` package's reader (``wyoming.event.async_read_event``) trusts the lengths a peer
sends (it reads whatever ``data_length`` says into memory), reads a line that is not JSON as the
end of the stream, and raises on a header of the wrong shape. Here a header line is parsed and
every length checked against the settings before anything more is read, so the shell never
holds more than the bounds. Writing uses the package's own serialiser. Pure: no I/O.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import orjson
from wyoming.event import Event, write_event

from streamtts.protocol import ErrorCode
from streamtts.wyoming.settings import WyomingSettings


@dataclass(frozen=True)
class FrameBounds:
    max_line_bytes: int
    max_data_bytes: int
    max_payload_bytes: int

    @classmethod
    def from_settings(cls, settings: WyomingSettings) -> FrameBounds:
        return cls(
            settings.wyoming_max_line_bytes,
            settings.wyoming_max_data_bytes,
            settings.wyoming_max_payload_bytes,
        )


class FramingError(Exception):
    """The peer's bytes are not a Wyoming event within the bounds; ``code`` is the documented
    error code (docs/protocol.md, "Wyoming")."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Header:
    type: str
    data: dict[str, Any]
    data_length: int
    payload_length: int


def parse_header(line: bytes, bounds: FrameBounds) -> Header:
    """The header of one event (its line, newline included or not). Raises :class:`FramingError`."""
    try:
        header = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise FramingError(ErrorCode.INVALID_JSON, f"an event header must be JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FramingError(ErrorCode.INVALID_MESSAGE, "an event header must be a JSON object")
    kind = header.get("type")
    if kind is None:
        raise FramingError(ErrorCode.MISSING_FIELD, "missing field 'type'")
    if not isinstance(kind, str):
        raise FramingError(ErrorCode.INVALID_FIELD, "'type' must be a string")
    data = header.get("data")
    if data is None:
        data = {}
    elif not isinstance(data, dict):
        raise FramingError(ErrorCode.INVALID_FIELD, "'data' must be a JSON object")
    data_length = _length(header, "data_length", bounds.max_data_bytes)
    payload_length = _length(header, "payload_length", bounds.max_payload_bytes)
    return Header(kind, data, data_length, payload_length)


def _length(header: dict[str, Any], name: str, limit: int) -> int:
    value = header.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FramingError(ErrorCode.INVALID_FIELD, f"'{name}' must be an integer >= 0")
    if value > limit:
        raise FramingError(
            ErrorCode.MESSAGE_TOO_BIG, f"'{name}' is {value} bytes; this server takes {limit}"
        )
    return value


def merge_data(header: Header, data_block: bytes) -> dict[str, Any]:
    """The event's data: the data block's JSON object merged over the header's ``data``."""
    if not data_block:
        return header.data
    try:
        block = orjson.loads(data_block)
    except orjson.JSONDecodeError as exc:
        raise FramingError(ErrorCode.INVALID_JSON, f"event data must be JSON: {exc}") from None
    if not isinstance(block, dict):
        raise FramingError(ErrorCode.INVALID_MESSAGE, "event data must be a JSON object")
    return {**header.data, **block}


def encode_event(event: Event) -> bytes:
    """The bytes of ``event`` on the wire, written by the ``wyoming`` package's serialiser."""
    buffer = io.BytesIO()
    write_event(event, buffer)
    return buffer.getvalue()
