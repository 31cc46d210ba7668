"""The native protocol as a dialect: parsing and serialising are the protocol module's."""

from __future__ import annotations

import orjson

from streamtts.protocol import (
    AudioFormat,
    CloseCode,
    ErrorCode,
    StartMessage,
    TextMessage,
    split_audio_frame,
)
from streamtts.server.dialects.base import Close, RefusalCause, Reject, Reply
from streamtts.server.dialects.native import NativeDialect


def test_frames_decode_to_the_session_messages_or_a_rejection() -> None:
    dialect = NativeDialect(max_text_chars=10)
    assert dialect.decode('{"type":"start","context":"a"}') == [StartMessage("a")]
    assert dialect.decode('{"type":"text","context":"a","text":"Hi"}') == [TextMessage("a", "Hi")]
    [reject] = dialect.decode('{"type":"text","context":"a","text":"far too long"}')
    assert isinstance(reject, Reject) and reject.code is ErrorCode.TEXT_TOO_LONG
    assert reject.context == "a"
    [binary] = dialect.decode(b"\x00")
    assert isinstance(binary, Reject) and binary.code is ErrorCode.BINARY_NOT_SUPPORTED


def test_events_are_the_native_messages() -> None:
    dialect = NativeDialect(max_text_chars=10)
    [started] = dialect.started("a", AudioFormat("mulaw", 8000))
    assert isinstance(started, Reply) and orjson.loads(started.frame)["encoding"] == "mulaw"
    assert split_audio_frame(dialect.audio("a", b"pcm")) == ("a", b"pcm")
    done = {"type": "done", "context": "a", "reason": "end", "stats": {"ttfa_ms": 1.0}}
    [reply] = dialect.event(done)
    assert isinstance(reply, Reply) and orjson.loads(reply.frame) == done
    [error] = dialect.rejected(ErrorCode.UNKNOWN_CONTEXT, "no such context", "b")
    assert isinstance(error, Reply)
    assert orjson.loads(error.frame) == {
        "type": "error",
        "code": "unknown_context",
        "message": "no such context",
        "context": "b",
    }
    assert dialect.idle() == [Close(CloseCode.POLICY, "idle timeout")]


def test_refusals_are_close_codes() -> None:
    assert NativeDialect.refusal(RefusalCause.OVERLOADED, "full").close_code == 1013
    assert NativeDialect.refusal(RefusalCause.UNAUTHORIZED, "no").close_code == 1008
    assert NativeDialect.refusal(RefusalCause.SHUTTING_DOWN, "bye").close_code == 1001
    assert NativeDialect.refusal(RefusalCause.ORIGIN, "no").http_status is None
