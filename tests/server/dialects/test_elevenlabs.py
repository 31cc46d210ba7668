"""The ElevenLabs dialect without sockets: URLs, both endpoints' messages, barge-in versus drain,
the frames it answers with and its refusals."""

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
    ProtocolError,
    StartMessage,
    TextMessage,
)
from streamtts.server.dialects.base import Close, RefusalCause, Reject, Reply
from streamtts.server.dialects.elevenlabs import (
    STREAM_INPUT_CONTEXT,
    ElevenLabsDialect,
    parse_output_format,
    parse_query,
)

VOICES = frozenset({"joe"})
PIPECAT_QUERY = {"model_id": "eleven_flash_v2_5", "output_format": "pcm_24000", "auto_mode": "true"}
LIVEKIT_QUERY = {
    "model_id": "eleven_turbo_v2_5",
    "output_format": "pcm_16000",
    "enable_ssml_parsing": "false",
    "enable_logging": "true",
    "inactivity_timeout": "180",
    "apply_text_normalization": "auto",
    "sync_alignment": "true",
    "auto_mode": "true",
}


def dialect(
    multi: bool, query: dict[str, str] | None = None, voice: str = "default"
) -> ElevenLabsDialect:
    d = ElevenLabsDialect(voice, query or {}, VOICES, max_text_chars=100, multi=multi)
    assert d.opening() == []
    return d


def send(d: ElevenLabsDialect, **message: Any) -> list[Any]:
    return d.decode(orjson.dumps(message).decode())


def frames(outputs: Sequence[object]) -> list[dict[str, Any]]:
    return [orjson.loads(o.frame) for o in outputs if isinstance(o, Reply)]


# ---- URLs ----


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("pcm_16000", AudioFormat("pcm_s16le", 16000)),
        ("pcm_32000", AudioFormat("pcm_s16le", 32000)),
        ("pcm_48000", AudioFormat("pcm_s16le", 48000)),
        ("ulaw_8000", AudioFormat("mulaw", 8000)),
        ("alaw_8000", AudioFormat("alaw", 8000)),
        ("mp3_44100_128", AudioFormat("mp3", 44100, 128_000)),
        ("mp3_22050_32", AudioFormat("mp3", 22050, 32_000)),
    ],
)
def test_output_formats(name: str, fmt: AudioFormat) -> None:
    assert parse_output_format(name) == fmt


@pytest.mark.parametrize("name", ["pcm_12345", "opus_48000_64", "mp3_44100_100", "wav", ""])
def test_output_formats_not_offered_say_what_is(name: str) -> None:
    with pytest.raises(ValueError, match="pcm_<rate>.*ulaw_8000.*mp3_44100_128"):
        parse_output_format(name)


def test_the_clients_queries_are_accepted() -> None:
    livekit = parse_query(LIVEKIT_QUERY)
    assert livekit.format == AudioFormat("pcm_s16le", 16000)
    assert livekit.auto_mode and livekit.inactivity_timeout_s == 180
    pipecat = parse_query(PIPECAT_QUERY)
    assert pipecat.auto_mode and pipecat.inactivity_timeout_s == 20  # the vendor's default
    sdk = parse_query({})  # convert_realtime without output_format: the SDK's default
    assert sdk.format == AudioFormat("mp3", 44100, 128_000) and not sdk.auto_mode


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"output_format": "opus_48000_64"}, ErrorCode.UNSUPPORTED_FORMAT),
        ({"enable_ssml_parsing": "true"}, ErrorCode.INVALID_FIELD),
        ({"apply_text_normalization": "off"}, ErrorCode.INVALID_FIELD),
        ({"auto_mode": "yes"}, ErrorCode.INVALID_FIELD),
        ({"inactivity_timeout": "181"}, ErrorCode.INVALID_FIELD),
        ({"inactivity_timeout": "-1"}, ErrorCode.INVALID_FIELD),
        ({"seed": "x"}, ErrorCode.INVALID_FIELD),
    ],
)
def test_what_cannot_be_honoured_is_refused(query: dict[str, str], code: ErrorCode) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_query(query)
    assert err.value.code is code


def test_a_bad_url_or_voice_closes_the_socket_with_1008_after_saying_why() -> None:
    bad_format = ElevenLabsDialect("joe", {"output_format": "opus_48000_64"}, VOICES, 100, True)
    [reply, close] = bad_format.opening()
    assert frames([reply])[0]["error"] == "unsupported_format"
    assert frames([reply])[0]["code"] == 1008 and close == Close(1008, close.reason)
    unknown = ElevenLabsDialect("nobody", {}, VOICES, 100, False)
    [reply, close] = unknown.opening()
    assert frames([reply])[0]["error"] == "unknown_voice" and isinstance(close, Close)
    assert ElevenLabsDialect("joe", {}, VOICES, 100, False).opening() == []


# ---- stream-input ----


def test_stream_input_as_the_sdk_sends_it() -> None:
    d = dialect(multi=False)
    opening = send(
        d,
        text=" ",
        try_trigger_generation=True,
        voice_settings=None,
        generation_config={"chunk_length_schedule": [50]},
    )
    assert opening == [
        StartMessage(STREAM_INPUT_CONTEXT, "default", AudioFormat("mp3", 44100, 128_000))
    ]
    assert send(d, text="Hello there, ", try_trigger_generation=True) == [
        TextMessage(STREAM_INPUT_CONTEXT, "Hello there, ")
    ]
    assert send(d, text="flush me.", flush=True) == [
        TextMessage(STREAM_INPUT_CONTEXT, "flush me."),
        FlushMessage(STREAM_INPUT_CONTEXT),
    ]
    assert send(d, text="") == [EndMessage(STREAM_INPUT_CONTEXT)]
    [late] = send(d, text="more")
    assert isinstance(late, Reject) and late.code is ErrorCode.CONTEXT_ENDED
    # The end: isFinal, then a normal close (the SDK hangs without it).
    outputs = d.done(STREAM_INPUT_CONTEXT, "end", {})
    assert frames(outputs) == [{"isFinal": True}] and outputs[-1] == Close(1000)


def test_stream_input_audio_is_base64_without_a_context_id() -> None:
    d = dialect(multi=False)
    send(d, text=" ")
    frame = orjson.loads(d.audio(STREAM_INPUT_CONTEXT, b"\x01\x02"))
    assert frame == {"audio": base64.b64encode(b"\x01\x02").decode(), "isFinal": False}
    assert d.segment(STREAM_INPUT_CONTEXT, "Hi.", 0, 10) == []  # no alignment: not real
    assert d.flushed(STREAM_INPUT_CONTEXT) == []


def test_stream_input_a_bad_opening_message_closes_a_bad_later_one_does_not() -> None:
    d = dialect(multi=False)
    [reject] = send(d, text=" ", voice_settings={"stability": 0.9})
    assert isinstance(reject, Reject) and reject.code is ErrorCode.INVALID_FIELD
    assert "stability" in reject.message
    [reply, close] = d.rejected(reject.code, reject.message, reject.context)
    assert frames([reply])[0]["code"] == 1008 and isinstance(close, Close)

    d = dialect(multi=False)
    send(d, text=" ")
    [reject] = d.decode("{not json")
    assert isinstance(reject, Reject) and reject.code is ErrorCode.INVALID_JSON
    [reply] = d.rejected(reject.code, reject.message, reject.context)
    assert frames([reply]) == [{"message": reject.message, "error": "invalid_json"}]


def test_stream_input_failure_and_refusal_close_the_socket() -> None:
    d = dialect(multi=False)
    send(d, text=" ")
    [reply, close] = d.failed(STREAM_INPUT_CONTEXT, ErrorCode.INTERNAL, "boom")
    assert frames([reply])[0] == {"message": "boom", "error": "internal", "code": 1011}
    assert close.code == 1011  # type: ignore[union-attr]
    assert d.done(STREAM_INPUT_CONTEXT, "error", {}) == []
    d = dialect(multi=False)
    send(d, text=" ")
    [reply, close] = d.start_refused(STREAM_INPUT_CONTEXT, ErrorCode.OVERLOADED, "full")
    assert frames([reply])[0]["error"] == "overloaded" and close == Close(1013, "full")


def test_voice_settings_speed_is_the_speed_option_and_defaults_are_no_request() -> None:
    d = dialect(multi=False, query={"seed": "7"})
    settings = {"stability": 0.5, "similarity_boost": 0.75, "speed": 1.1, "use_speaker_boost": True}
    [start] = send(d, text=" ", voice_settings=settings)
    assert isinstance(start, StartMessage)
    assert start.options == SynthesisOptions(speed=1.1, seed=7)


# ---- multi-stream-input ----


def open_context(d: ElevenLabsDialect, context: str = "c") -> None:
    actions = send(d, text=" ", context_id=context)
    assert [type(a) for a in actions] == [StartMessage]


def test_pipecat_turn_end_drains_and_an_interruption_is_a_barge_in() -> None:
    d = dialect(multi=True, query={"output_format": "pcm_24000"})
    open_context(d, "turn1")
    assert send(d, text="Hello there.", context_id="turn1") == [
        TextMessage("turn1", "Hello there.")
    ]
    # Pipecat's sentences carry no spaces: the next one is joined with one.
    assert send(d, text="It works.", context_id="turn1") == [TextMessage("turn1", " It works.")]
    assert send(d, context_id="turn1", flush=True) == [FlushMessage("turn1")]
    assert send(d, context_id="turn1", close_context=True) == [EndMessage("turn1")]
    assert send(d, context_id="turn1", close_context=True) == []  # one isFinal comes
    assert frames(d.done("turn1", "end", {})) == [{"isFinal": True, "contextId": "turn1"}]

    open_context(d, "turn2")
    send(d, text="A long answer that gets interrupted.", context_id="turn2")
    assert send(d, context_id="turn2", close_context=True) == [CancelMessage("turn2")]
    assert frames(d.done("turn2", "cancel", {})) == [{"isFinal": True, "contextId": "turn2"}]


def test_auto_mode_speaks_each_message_at_once_but_only_a_flush_makes_close_drain() -> None:
    d = dialect(multi=True, query=PIPECAT_QUERY)
    open_context(d)
    assert send(d, text="One sentence.", context_id="c") == [
        TextMessage("c", "One sentence."),
        FlushMessage("c"),
    ]
    assert send(d, context_id="c", close_context=True) == [CancelMessage("c")]


def test_livekit_sentences_with_flush_then_end_input_then_close() -> None:
    d = dialect(multi=True, query=LIVEKIT_QUERY)
    assert d.idle_timeout_s == 180
    assert [type(a) for a in send(d, text=" ", voice_settings={}, context_id="lk")] == [
        StartMessage
    ]
    assert send(d, text="First one. ", context_id="lk", flush=True) == [
        TextMessage("lk", "First one. "),
        FlushMessage("lk"),
    ]
    assert send(d, text="", context_id="lk", flush=True) == [FlushMessage("lk")]
    assert send(d, context_id="lk", close_context=True) == [EndMessage("lk")]


def test_keepalives_end_nothing_and_unknown_contexts_still_get_their_is_final() -> None:
    d = dialect(multi=True)
    assert send(d, text="") == []
    assert send(d, text="", context_id="new") == []  # opens nothing
    open_context(d)
    assert send(d, text="", context_id="c") == []
    [reply] = send(d, context_id="ghost", close_context=True)
    assert isinstance(reply, Reply)
    assert frames([reply]) == [{"isFinal": True, "contextId": "ghost"}]
    [reject] = send(d, context_id="ghost", flush=True)
    assert isinstance(reject, Reject) and reject.code is ErrorCode.UNKNOWN_CONTEXT


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"text": "Hi", "context_id": 5}, ErrorCode.INVALID_FIELD),
        ({"text": "Hi", "context_id": ""}, ErrorCode.INVALID_FIELD),
        ({"text": "Hi"}, ErrorCode.MISSING_FIELD),
        ({"text": 3, "context_id": "c"}, ErrorCode.INVALID_FIELD),
        ({"text": "Hi", "context_id": "c", "flush": "yes"}, ErrorCode.INVALID_FIELD),
        ({"text": "x" * 101, "context_id": "c"}, ErrorCode.TEXT_TOO_LONG),
        ({"text": " ", "context_id": "c", "voice_settings": []}, ErrorCode.INVALID_FIELD),
        ({"text": " ", "context_id": "c", "voice_settings": {"speed": 9}}, ErrorCode.INVALID_FIELD),
        (
            {"text": " ", "context_id": "c", "generation_config": {"chunk_length_schedule": [5]}},
            ErrorCode.INVALID_FIELD,
        ),
    ],
)
def test_bad_messages_are_rejected_with_their_context(
    message: dict[str, Any], code: ErrorCode
) -> None:
    d = dialect(multi=True)
    [reject] = send(d, **message)
    assert isinstance(reject, Reject) and reject.code is code
    [reply] = d.rejected(reject.code, reject.message, reject.context)
    body = frames([reply])[0]
    assert body["error"] == code.value and body["message"]
    if isinstance(message.get("context_id"), str) and message["context_id"]:
        assert body["contextId"] == message["context_id"]
    assert "code" not in body  # the socket stays open


def test_text_after_close_context_is_refused_for_that_context_only() -> None:
    d = dialect(multi=True)
    open_context(d, "a")
    open_context(d, "b")
    send(d, context_id="a", close_context=True)
    [reject] = send(d, text="late", context_id="a")
    assert isinstance(reject, Reject) and reject.code is ErrorCode.CONTEXT_ENDED
    assert send(d, text="fine", context_id="b") == [TextMessage("b", "fine")]


def test_voice_settings_belong_to_a_contexts_first_message() -> None:
    d = dialect(multi=True)
    send(d, text=" ", context_id="c", voice_settings={"speed": 1.0})
    assert send(d, text="same", context_id="c", voice_settings={"speed": 1.0}) == [
        TextMessage("c", "same")
    ]
    [reject] = send(d, text="x", context_id="c", voice_settings={"speed": 1.1})
    assert isinstance(reject, Reject) and reject.code is ErrorCode.INVALID_FIELD


def test_close_socket_lets_flushed_contexts_finish_and_then_closes() -> None:
    d = dialect(multi=True)
    open_context(d, "flushed")
    send(d, text="Done.", context_id="flushed", flush=True)
    open_context(d, "talking")
    send(d, text="Still talk", context_id="talking")
    assert send(d, close_socket=True) == [EndMessage("flushed"), CancelMessage("talking")]
    assert d.done("flushed", "end", {})[-1] != Close(1000)
    assert d.done("talking", "cancel", {})[-1] == Close(1000)
    empty = dialect(multi=True)
    assert send(empty, close_socket=True) == [Close(1000)]


def test_multi_events_carry_camel_case_context_ids() -> None:
    d = dialect(multi=True)
    open_context(d)
    assert orjson.loads(d.audio("c", b"ab"))["contextId"] == "c"
    assert frames(d.failed("c", ErrorCode.SLOW_CONSUMER, "slow")) == [
        {"message": "slow", "error": "slow_consumer", "contextId": "c"}
    ]
    assert frames(d.done("c", "error", {})) == [{"isFinal": True, "contextId": "c"}]
    open_context(d, "s")
    shutdown = frames(d.done("s", "shutdown", {}))
    assert shutdown[0]["error"] == "shutting_down" and shutdown[0]["contextId"] == "s"


def test_a_refused_start_answers_the_error_then_is_final() -> None:
    d = dialect(multi=True)
    open_context(d)
    outputs = d.start_refused("c", ErrorCode.OVERLOADED, "full")
    assert frames(outputs) == [
        {"message": "full", "error": "overloaded", "contextId": "c"},
        {"isFinal": True, "contextId": "c"},
    ]
    # The context is gone: its next text opens it again.
    assert [type(a) for a in send(d, text="again", context_id="c")] == [StartMessage, TextMessage]


def test_idle_and_refusals_say_why_then_close() -> None:
    d = dialect(multi=True)
    [reply, close] = d.idle()
    body = frames([reply])[0]
    assert body["error"] == "input_timeout_exceeded" and body["code"] == 1008
    assert close == Close(1008, close.reason)  # type: ignore[union-attr]
    refusal = ElevenLabsDialect.refusal(RefusalCause.UNAUTHORIZED, "a key is required")
    assert refusal.close_code == 1008 and refusal.http_status is None
    assert orjson.loads(refusal.frames[0]) == {
        "message": "a key is required",
        "error": "unauthorized",
        "code": 1008,
    }
    assert ElevenLabsDialect.refusal(RefusalCause.OVERLOADED, "full").close_code == 1013
