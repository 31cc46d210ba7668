"""The live socket's frames: msgpack maps both ways, every bad frame a documented code."""

from __future__ import annotations

import msgpack
import pytest
from fishaudio.types import CloseEvent, FlushEvent, StartEvent, TextEvent, TTSRequest

from streamtts.fishapi.live import (
    LiveError,
    LiveFlush,
    LiveStart,
    LiveStop,
    LiveText,
    audio_event,
    finish_event,
    parse_event,
)
from streamtts.limits import Limits
from streamtts.protocol import ErrorCode

LIMITS = Limits(max_text_per_message_chars=50)


def frame(event: object) -> bytes:
    return bytes(msgpack.packb(event, use_bin_type=True))


def test_the_sdk_events_parse() -> None:
    start = parse_event(
        frame(StartEvent(request=TTSRequest(text="", format="pcm")).model_dump()), LIMITS
    )
    assert isinstance(start, LiveStart) and start.request.format == "pcm"
    assert parse_event(frame(TextEvent(text="Hello").model_dump()), LIMITS) == LiveText("Hello")
    assert parse_event(frame(FlushEvent().model_dump()), LIMITS) == LiveFlush()
    assert parse_event(frame(CloseEvent().model_dump()), LIMITS) == LiveStop()


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"\xc1", ErrorCode.INVALID_MESSAGE),
        (frame([1, 2]), ErrorCode.INVALID_MESSAGE),
        (frame({"text": "x"}), ErrorCode.MISSING_FIELD),
        (frame({"event": "sing"}), ErrorCode.UNKNOWN_TYPE),
        (frame({"event": "text", "text": 5}), ErrorCode.INVALID_FIELD),
        (frame({"event": "text", "text": "x" * 51}), ErrorCode.TEXT_TOO_LONG),
        (frame({"event": "start"}), ErrorCode.MISSING_FIELD),
        (
            frame({"event": "start", "request": {"text": "", "format": "aiff"}}),
            ErrorCode.INVALID_FIELD,
        ),
        (frame({"event": "start", "request": "text"}), ErrorCode.INVALID_MESSAGE),
    ],
)
def test_bad_frames(raw: bytes, code: ErrorCode) -> None:
    with pytest.raises(LiveError) as info:
        parse_event(raw, LIMITS)
    assert info.value.code == code and info.value.message


def test_server_events_are_msgpack_with_binary_audio() -> None:
    assert msgpack.unpackb(audio_event(b"\x00\x01"), raw=False) == {
        "event": "audio",
        "audio": b"\x00\x01",
    }
    assert msgpack.unpackb(finish_event("stop")) == {"event": "finish", "reason": "stop"}
    assert msgpack.unpackb(finish_event("error", "overloaded", "full")) == {
        "event": "finish",
        "reason": "error",
        "code": "overloaded",
        "message": "full",
    }
