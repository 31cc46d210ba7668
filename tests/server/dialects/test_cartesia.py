"""The Cartesia dialect without sockets: requests as the SDK and Pipecat send them, flushes,
cancel's silence, errors that end a context, and what every frame carries."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from streamtts.options import SynthesisOptions
from streamtts.protocol import (
    AudioFormat,
    CancelMessage,
    EndMessage,
    ErrorCode,
    FlushMessage,
    StartMessage,
    TextMessage,
)
from streamtts.server.dialects.base import Close, RefusalCause, Reject, Reply
from streamtts.server.dialects.cartesia import CartesiaDialect
from tests.cartesia_messages import F32_44K, pipecat, sdk_push


def send(d: CartesiaDialect, message: dict[str, Any]) -> list[Any]:
    return d.decode(orjson.dumps(message).decode())


def frames(outputs: Sequence[object]) -> list[dict[str, Any]]:
    return [orjson.loads(o.frame) for o in outputs if isinstance(o, Reply)]


def test_the_sdk_context_push_then_no_more_inputs() -> None:
    d = CartesiaDialect(max_text_chars=100)
    assert send(d, sdk_push("c", "Hello there, this ")) == [
        StartMessage("c", "default", AudioFormat("pcm_f32le", 44100)),
        TextMessage("c", "Hello there, this "),
    ]
    assert send(d, sdk_push("c", "is a streaming test.")) == [
        TextMessage("c", "is a streaming test.")
    ]
    # no_more_inputs: an empty transcript, continue false, maybe another voice id.
    assert send(d, {**sdk_push("c", "", more=False), "voice": "6ccbfb76"}) == [EndMessage("c")]
    [reject] = send(d, sdk_push("c", "late"))
    assert isinstance(reject, Reject) and reject.code is ErrorCode.CONTEXT_ENDED
    assert frames(d.done("c", "end", {})) == [
        {"type": "done", "context_id": "c", "done": True, "status_code": 206}
    ]


def test_pipecat_sentences_are_spoken_at_once_and_joined_with_a_space() -> None:
    d = CartesiaDialect(max_text_chars=100)
    actions = send(d, pipecat("p", "This is a test."))
    assert actions == [
        StartMessage("p", "default", AudioFormat("pcm_s16le", 24000)),
        TextMessage("p", "This is a test."),
        FlushMessage("p"),  # max_buffer_delay_ms 0: generate as it arrives
    ]
    assert send(d, pipecat("p", "It checks.")) == [
        TextMessage("p", " It checks."),
        FlushMessage("p"),
    ]
    assert send(d, pipecat("p", "", more=False)) == [EndMessage("p")]
    assert d.flushed("p") == []  # its own flushes are not the client's: no flush_done
    assert d.flushed("p") == []


def test_flush_is_answered_with_flush_done_and_later_chunks_carry_its_id() -> None:
    d = CartesiaDialect(max_text_chars=100)
    send(d, sdk_push("c", "One."))
    assert "flush_id" not in orjson.loads(d.audio("c", b"a") or "")
    assert send(d, sdk_push("c", "Two.", flush=True)) == [
        TextMessage("c", " Two."),
        FlushMessage("c"),
    ]
    assert frames(d.flushed("c")) == [
        {
            "type": "flush_done",
            "context_id": "c",
            "done": False,
            "flush_done": True,
            "flush_id": 1,
            "status_code": 206,
        }
    ]
    chunk = orjson.loads(d.audio("c", b"\x00\x01") or "")
    assert chunk == {
        "type": "chunk",
        "context_id": "c",
        "data": base64.b64encode(b"\x00\x01").decode(),
        "done": False,
        "status_code": 206,
        "flush_id": 1,
    }


def test_max_buffer_delay_is_the_contexts_buffering_bound() -> None:
    d = CartesiaDialect(max_text_chars=100)
    [start, _] = send(d, sdk_push("c", "Hi", max_buffer_delay_ms=400))
    assert isinstance(start, StartMessage) and start.max_buffer_delay_ms == 400
    [start, _] = send(d, sdk_push("d", "Hi"))
    assert isinstance(start, StartMessage) and start.max_buffer_delay_ms is None


def test_cancel_stops_the_context_and_nothing_more_is_sent_for_it() -> None:
    d = CartesiaDialect(max_text_chars=100)
    send(d, pipecat("c", "A long sentence."))
    assert send(d, {"context_id": "c", "cancel": True}) == [CancelMessage("c")]
    assert d.audio("c", b"late") is None
    assert d.flushed("c") == []
    assert d.failed("c", ErrorCode.INTERNAL, "x") == []
    assert d.done("c", "cancel", {}) == []  # not even done
    assert send(d, {"context_id": "c", "cancel": True}) == []  # unknown now: nothing
    assert send(d, {"context_id": "never", "cancel": True}) == []


def test_an_error_ends_its_context() -> None:
    d = CartesiaDialect(max_text_chars=100)
    send(d, sdk_push("c", "Hello."))
    outputs = d.rejected(ErrorCode.TEXT_TOO_LONG, "too long", "c")
    assert outputs[1:] == [CancelMessage("c")]
    assert frames(outputs) == [
        {
            "type": "error",
            "context_id": "c",
            "done": True,
            "status_code": 400,
            "title": "Bad Request",
            "message": "too long",
            "error_code": "text_too_long",
        }
    ]
    assert d.done("c", "cancel", {}) == []
    # A failure while running: the error, and no done after it.
    send(d, sdk_push("e", "Hello."))
    assert frames(d.failed("e", ErrorCode.INTERNAL, "boom"))[0]["status_code"] == 500
    assert d.done("e", "error", {}) == []


def test_every_frame_has_type_and_context_id_even_without_a_context() -> None:
    d = CartesiaDialect(max_text_chars=100)
    [reject] = d.decode("{nope")
    assert isinstance(reject, Reject) and reject.code is ErrorCode.INVALID_JSON
    [reply] = d.rejected(reject.code, reject.message, reject.context)
    body = frames([reply])[0]
    assert body["type"] == "error" and "context_id" in body and body["context_id"] is None
    started = d.start_refused("x", ErrorCode.OVERLOADED, "full")
    assert frames(started)[0]["status_code"] == 429 and frames(started)[0]["context_id"] == "x"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"transcript": None}, ErrorCode.MISSING_FIELD),
        ({"transcript": 3}, ErrorCode.INVALID_FIELD),
        ({"context_id": None}, ErrorCode.MISSING_FIELD),
        ({"context_id": ["x"]}, ErrorCode.INVALID_FIELD),
        ({"voice": None}, ErrorCode.MISSING_FIELD),
        ({"voice": {"mode": "embedding", "embedding": [0.1]}}, ErrorCode.INVALID_FIELD),
        ({"voice": {"mode": "id"}}, ErrorCode.MISSING_FIELD),
        ({"output_format": None}, ErrorCode.MISSING_FIELD),
        ({"output_format": {**F32_44K, "container": "mp3"}}, ErrorCode.UNSUPPORTED_FORMAT),
        ({"output_format": {**F32_44K, "encoding": "opus"}}, ErrorCode.UNSUPPORTED_FORMAT),
        ({"output_format": {**F32_44K, "sample_rate": 32000}}, ErrorCode.UNSUPPORTED_FORMAT),
        ({"output_format": {**F32_44K, "sample_rate": True}}, ErrorCode.UNSUPPORTED_FORMAT),
        ({"continue": "yes"}, ErrorCode.INVALID_FIELD),
        ({"max_buffer_delay_ms": 5001}, ErrorCode.INVALID_FIELD),
        ({"generation_config": {"volume": 1.5}}, ErrorCode.INVALID_FIELD),
        ({"generation_config": {"emotion": "happy"}}, ErrorCode.INVALID_FIELD),
        ({"generation_config": {"speed": 99}}, ErrorCode.INVALID_FIELD),
        ({"speed": "fast"}, ErrorCode.INVALID_FIELD),
        ({"pronunciation_dict_id": "dict"}, ErrorCode.INVALID_FIELD),
        ({"transcript": "x" * 101}, ErrorCode.TEXT_TOO_LONG),
    ],
)
def test_bad_requests_are_rejected(change: dict[str, Any], code: ErrorCode) -> None:
    d = CartesiaDialect(max_text_chars=100)
    message = {k: v for k, v in {**sdk_push("c", "Hi"), **change}.items() if v is not None}
    [reject] = send(d, message)
    assert isinstance(reject, Reject) and reject.code is code


def test_options_and_fields_that_change_nothing() -> None:
    d = CartesiaDialect(max_text_chars=100)
    message = sdk_push(
        "c",
        "Hi",
        generation_config={"speed": 1.2, "volume": 1.0},
        speed="normal",
        language="en",
        add_timestamps=True,
        add_phoneme_timestamps=False,
        use_normalized_timestamps=True,
        pronunciation_dict_id=None,
        duration=3,  # an unknown (legacy) field is not looked at
    )
    [start, _] = send(d, message)
    assert isinstance(start, StartMessage) and start.options == SynthesisOptions(speed=1.2)
    start, *_ = send(d, {**pipecat("d", "Hi"), "voice": {"id": "default"}})
    assert isinstance(start, StartMessage) and start.voice == "default"


def test_binary_frames_and_refusals() -> None:
    d = CartesiaDialect(max_text_chars=100)
    [reject] = d.decode(b"\x00")
    assert isinstance(reject, Reject) and reject.code is ErrorCode.BINARY_NOT_SUPPORTED
    refusal = CartesiaDialect.refusal(RefusalCause.UNAUTHORIZED, "a key is required")
    assert refusal.http_status == 401 and refusal.close_code == 1008
    assert orjson.loads(refusal.http_body)["message"] == "a key is required"
    assert CartesiaDialect.refusal(RefusalCause.OVERLOADED, "full").http_status == 429
    assert CartesiaDialect.refusal(RefusalCause.SHUTTING_DOWN, "bye").http_status == 503
    assert d.idle() == [Close(1008, "idle timeout")]
