"""Protocol parsing and serialisation, without I/O."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.options import SynthesisOptions
from streamtts.protocol import (
    AudioFormat,
    CancelMessage,
    EndMessage,
    ErrorCode,
    FlushMessage,
    ProtocolError,
    StartMessage,
    TextMessage,
    audio_frame,
    done,
    parse_client_message,
    split_audio_frame,
)
from tests.strategies import JSON_VALUES, near_native_messages

LIMIT = 100


def parse(obj: object) -> object:
    return parse_client_message(orjson.dumps(obj), LIMIT)


def error_code(raw: str | bytes) -> ErrorCode:
    with pytest.raises(ProtocolError) as info:
        parse_client_message(raw, LIMIT)
    return info.value.code


def test_start_with_defaults() -> None:
    msg = parse({"type": "start", "context": "c1"})
    assert msg == StartMessage("c1", None, AudioFormat("pcm_s16le", 24000), SynthesisOptions())


def test_start_with_format_voice_and_options() -> None:
    msg = parse(
        {
            "type": "start",
            "context": "c1",
            "voice": "v",
            "format": {"encoding": "mulaw", "sample_rate": 8000},
            "options": {"speed": 1.5, "seed": 7, "temperature": 0.7},
        }
    )
    # A value equal to its option's default (temperature 0.7) asks for nothing: unset.
    options = SynthesisOptions(speed=1.5, seed=7)
    assert msg == StartMessage("c1", "v", AudioFormat("mulaw", 8000), options)


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        ({"type": "text", "context": "c", "text": "hi"}, TextMessage("c", "hi")),
        ({"type": "flush", "context": "c"}, FlushMessage("c")),
        ({"type": "end", "context": "c"}, EndMessage("c")),
        ({"type": "cancel", "context": "c"}, CancelMessage("c")),
    ],
)
def test_control_messages(obj: object, kind: object) -> None:
    assert parse(obj) == kind


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", ErrorCode.INVALID_JSON),
        (b"\xff\xfe", ErrorCode.INVALID_JSON),
        (b"[1, 2]", ErrorCode.INVALID_MESSAGE),
        (b'"start"', ErrorCode.INVALID_MESSAGE),
        (b'{"context": "c"}', ErrorCode.MISSING_FIELD),
        (b'{"type": 3, "context": "c"}', ErrorCode.INVALID_FIELD),
        (b'{"type": "dance", "context": "c"}', ErrorCode.UNKNOWN_TYPE),
        (b'{"type": "text", "text": "x"}', ErrorCode.MISSING_FIELD),
        (b'{"type": "text", "context": 5, "text": "x"}', ErrorCode.INVALID_FIELD),
        (b'{"type": "text", "context": "", "text": "x"}', ErrorCode.INVALID_FIELD),
        (b'{"type": "text", "context": "c"}', ErrorCode.MISSING_FIELD),
        (b'{"type": "text", "context": "c", "text": ["x"]}', ErrorCode.INVALID_FIELD),
        (b'{"type": "start", "context": "c", "voice": 1}', ErrorCode.INVALID_FIELD),
        (b'{"type": "start", "context": "c", "format": "wav"}', ErrorCode.INVALID_FIELD),
        (
            b'{"type": "start", "context": "c", "format": {"encoding": "mp3"}}',
            ErrorCode.UNSUPPORTED_FORMAT,
        ),
        (
            b'{"type": "start", "context": "c", "format": {"sample_rate": 4000}}',
            ErrorCode.UNSUPPORTED_FORMAT,
        ),
        (
            b'{"type": "start", "context": "c", "format": {"sample_rate": 96000}}',
            ErrorCode.UNSUPPORTED_FORMAT,
        ),
        (
            b'{"type": "start", "context": "c", "format": {"sample_rate": "8000"}}',
            ErrorCode.INVALID_FIELD,
        ),
        (
            b'{"type": "start", "context": "c", "format": {"sample_rate": true}}',
            ErrorCode.INVALID_FIELD,
        ),
        (b'{"type": "start", "context": "c", "options": {"speed": 9}}', ErrorCode.INVALID_FIELD),
        (b'{"type": "start", "context": "c", "options": {"warp": 1}}', ErrorCode.INVALID_FIELD),
        (b'{"type": "start", "context": "c", "options": {"seed": 1.5}}', ErrorCode.INVALID_FIELD),
    ],
)
def test_errors_have_documented_codes(raw: bytes, code: ErrorCode) -> None:
    assert error_code(raw) == code


def test_text_over_the_per_message_limit() -> None:
    with pytest.raises(ProtocolError) as info:
        parse({"type": "text", "context": "c", "text": "x" * (LIMIT + 1)})
    assert info.value.code == ErrorCode.TEXT_TOO_LONG
    assert info.value.context == "c"


def test_context_id_longer_than_the_frame_prefix_allows() -> None:
    assert error_code(orjson.dumps({"type": "end", "context": "é" * 128})) == (
        ErrorCode.INVALID_FIELD
    )


def test_every_error_code_is_documented() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "protocol.md").read_text()
    for code in ErrorCode:
        assert f"`{code.value}`" in doc, code


def test_audio_frame_round_trip() -> None:
    frame = audio_frame("ctx-é", b"\x01\x02\x03")
    assert frame[0] == len("ctx-é".encode())
    assert split_audio_frame(frame) == ("ctx-é", b"\x01\x02\x03")


def test_done_message_shape() -> None:
    msg = done("c", "end", {"ttfa_ms": 12.5, "audio_ms": 1000.0, "rtf": 0.1})
    assert msg == {
        "type": "done",
        "context": "c",
        "reason": "end",
        "stats": {"ttfa_ms": 12.5, "audio_ms": 1000.0, "rtf": 0.1},
    }


# ---- property-based fuzzing ----------------------------------------------------------------

DOCUMENTED_CODES = {
    code.value
    for code in ErrorCode
    if f"`{code.value}`" in (Path(__file__).parents[1] / "docs" / "protocol.md").read_text()
}
NEAR_MESSAGES = near_native_messages(st.text(max_size=300), st.text(max_size=10))


def assert_parses_or_documented_error(raw: str | bytes) -> None:
    try:
        message = parse_client_message(raw, LIMIT)
    except ProtocolError as exc:
        assert exc.code.value in DOCUMENTED_CODES, exc.code
        assert exc.message
        return
    assert isinstance(
        message, StartMessage | TextMessage | FlushMessage | EndMessage | CancelMessage
    )


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_else(raw: bytes) -> None:
    assert_parses_or_documented_error(raw)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=200))
def test_random_text_never_raises_anything_else(raw: str) -> None:
    assert_parses_or_documented_error(raw)


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES)
def test_random_json_never_raises_anything_else(value: object) -> None:
    # The standard library writes what orjson will not (integers beyond 64 bits, Infinity).
    assert_parses_or_documented_error(json.dumps(value))


@settings(max_examples=1500, deadline=None)
@given(NEAR_MESSAGES)
def test_near_messages_parse_or_fail_with_a_documented_code(value: dict[str, object]) -> None:
    assert_parses_or_documented_error(json.dumps(value))


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=40))
def test_invalid_utf8_is_invalid_json(raw: bytes) -> None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        assert error_code(b'{"type": "text", "text": "' + raw + b'"}') is ErrorCode.INVALID_JSON
