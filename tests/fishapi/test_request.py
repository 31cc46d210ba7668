"""The Fish TTS request, field by field, as the real SDKs build it (their own pydantic models):
formats and bit rates, voices, options through the option table (defaults ask for nothing),
transport fields, inline references validated, and every bad field named."""

from __future__ import annotations

import base64
from typing import Any

import fish_audio_sdk
import msgpack
import orjson
import pytest
from fishaudio.types import Prosody, ReferenceAudio, StartEvent, TTSRequest

from streamtts.fishapi.request import (
    FishRequestError,
    Reference,
    decode_body,
    parse_request,
)
from streamtts.options import TRANSPORT_FIELDS, SynthesisOptions
from streamtts.protocol import ErrorCode

LIMIT = 4096


def parse(body: Any, require_text: bool = True) -> Any:
    return parse_request(body, LIMIT, require_text=require_text)


def refused(body: dict[str, Any]) -> FishRequestError:
    with pytest.raises(FishRequestError) as info:
        parse({"text": "Hello.", **body})
    return info.value


def test_the_legacy_sdk_body_with_its_nulls_asks_for_nothing_but_its_format() -> None:
    body = fish_audio_sdk.TTSRequest(text="Hello there.", format="mp3").model_dump()
    assert body["sample_rate"] is None and body["prosody"] is None and body["references"] == []
    request = parse(body)
    assert request.text == "Hello there." and request.format == "mp3"
    assert request.sample_rate_hz is None and request.voice is None and request.references == ()
    assert request.bit_rate_bps == 128_000  # the SDK's mp3_bitrate, honoured
    assert request.options == SynthesisOptions()  # top_p / temperature at their defaults


def test_the_new_sdk_body_asks_for_nothing_but_its_format() -> None:
    body = TTSRequest(text="Hello.", format="opus").model_dump(exclude_none=True)
    assert {"max_new_tokens", "min_chunk_length", "early_stop_threshold"} <= set(body)
    request = parse(body)
    assert request.format == "opus" and request.bit_rate_bps == 32_000
    assert request.options == SynthesisOptions()


def test_the_live_start_carries_nil_for_unset_fields_and_empty_text() -> None:
    request = StartEvent(request=TTSRequest(text="")).model_dump()["request"]
    assert request["reference_id"] is None and request["prosody"] is None
    parsed = parse(request, require_text=False)
    assert parsed.text == "" and parsed.options == SynthesisOptions()


def test_options_go_through_the_option_table() -> None:
    body = TTSRequest(
        text="Hi.",
        top_p=0.5,
        temperature=0.9,
        repetition_penalty=1.3,
        max_new_tokens=300,
        prosody=Prosody(speed=1.5),
    ).model_dump(exclude_none=True)
    options = parse({**body, "seed": 7}).options
    assert options == SynthesisOptions(
        speed=1.5,
        temperature=0.9,
        top_p=0.5,
        repetition_penalty=1.3,
        seed=7,
        max_frames_per_segment=300,
    )
    # The SDK's max_new_tokens default and upstream's 0 mean the server's own setting.
    assert parse({"text": "Hi.", "max_new_tokens": 0}).options == SynthesisOptions()
    assert parse({"text": "Hi.", "prosody": {"speed": 1.0, "volume": 0}}).options.speed is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": "hot"}, "temperature"),
        ({"seed": 1.5}, "seed"),
        ({"prosody": {"speed": 9.0}}, "prosody.speed"),
        ({"prosody": {"volume": 3.0}}, "prosody.volume"),
        ({"prosody": {"pitch": 1}}, "prosody"),
        ({"max_new_tokens": 100_000}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"condition_on_previous_chunks": False}, "condition_on_previous_chunks"),
        ({"early_stop_threshold": 0.5}, "early_stop_threshold"),
        ({"format": "flac"}, "format"),
        ({"sample_rate": 96_000}, "sample_rate"),
        ({"sample_rate": "16000"}, "sample_rate"),
        ({"mp3_bitrate": 96}, "mp3_bitrate"),
        ({"opus_bitrate": 16}, "opus_bitrate"),
        ({"reference_id": 5}, "reference_id"),
        ({"latency": "fast"}, "latency"),
        ({"normalize": "yes"}, "normalize"),
        ({"chunk_length": 50}, "chunk_length"),
        ({"streaming": 1}, "streaming"),
        ({"text": 3}, "text"),
        ({"text": "   "}, "text"),
        ({"text": "x" * (LIMIT + 1)}, "text"),
        ({"voice": "alloy"}, "voice"),
    ],
)
def test_every_bad_field_is_refused_by_name(body: dict[str, Any], field: str) -> None:
    error = refused(body)
    assert error.field == field and error.code == ErrorCode.INVALID_FIELD
    assert field.split(".")[-1] in error.message


def test_transport_fields_change_nothing() -> None:
    plain = parse({"text": "Hi."})
    every = parse(
        {
            "text": "Hi.",
            "chunk_length": 300,
            "min_chunk_length": 50,
            "normalize": False,
            "latency": "normal",
            "streaming": True,
            "use_memory_cache": "on",
        }
    )
    assert every == plain
    assert set(TRANSPORT_FIELDS["fish"]) == {
        "chunk_length",
        "min_chunk_length",
        "normalize",
        "latency",
        "streaming",
        "use_memory_cache",
    }


def test_bit_rates_apply_to_their_own_format_only() -> None:
    assert parse({"text": "Hi.", "format": "mp3", "mp3_bitrate": 64}).bit_rate_bps == 64_000
    assert parse({"text": "Hi.", "format": "opus", "opus_bitrate": 48}).bit_rate_bps == 48_000
    assert parse({"text": "Hi.", "format": "opus", "opus_bitrate": -1000}).bit_rate_bps is None
    assert parse({"text": "Hi.", "format": "wav", "mp3_bitrate": 192}).bit_rate_bps is None
    assert parse({"text": "Hi."}).format == "wav"


def test_inline_references_are_parsed_and_validated() -> None:
    body = TTSRequest(
        text="Hi.", references=[ReferenceAudio(audio=b"RIFF....", text="A reference.")]
    ).model_dump(exclude_none=True)
    packed = decode_body(msgpack.packb(body, use_bin_type=True), "application/msgpack")
    assert parse(packed).references == (Reference(b"RIFF....", "A reference."),)
    as_json = {
        "text": "Hi.",
        "references": [{"audio": base64.b64encode(b"RIFF").decode(), "text": ""}],
    }
    assert parse(decode_body(orjson.dumps(as_json), "application/json")).references == (
        Reference(b"RIFF", ""),
    )
    for bad, field in [
        ("not a list", "references"),
        ([{"audio": b"x"}], "references[0]"),
        ([{"audio": b"", "text": "t"}], "references[0].audio"),
        ([{"audio": "%%%", "text": "t"}], "references[0].audio"),
        ([{"audio": b"x", "text": 1}], "references[0].text"),
    ]:
        assert refused({"references": bad}).field == field


def test_bodies_are_msgpack_or_json_and_anything_else_is_refused() -> None:
    body = {"text": "Hi.", "format": "pcm"}
    assert decode_body(msgpack.packb(body), "application/msgpack; charset=binary") == body
    assert decode_body(orjson.dumps(body), "application/json") == body
    assert decode_body(orjson.dumps(body), "") == body  # JSON unless msgpack is said
    for raw, kind in [(b"\xc1", "application/msgpack"), (b"{nope", "application/json")]:
        with pytest.raises(FishRequestError) as info:
            decode_body(raw, kind)
        assert info.value.code == ErrorCode.INVALID_JSON
    for not_a_map in (["text"], "text", 3):
        with pytest.raises(FishRequestError) as info:
            parse(not_a_map)
        assert info.value.code == ErrorCode.INVALID_MESSAGE
