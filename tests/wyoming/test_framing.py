"""Bounded Wyoming framing: every malformed or oversized header is a documented error before
anything more is read; the writer is the ``wyoming`` package's, so its reader reads it back."""

from __future__ import annotations

import asyncio

import pytest
from wyoming.audio import AudioChunk
from wyoming.event import async_read_event

from streamtts.protocol import ErrorCode
from streamtts.wyoming.framing import (
    FrameBounds,
    FramingError,
    Header,
    encode_event,
    merge_data,
    parse_header,
)

BOUNDS = FrameBounds(max_line_bytes=1024, max_data_bytes=100, max_payload_bytes=50)


def test_a_header_with_lengths_and_inline_data() -> None:
    line = b'{"type": "synthesize", "data": {"a": 1}, "data_length": 12, "version": "1.7"}\n'
    header = parse_header(line, BOUNDS)
    assert header == Header("synthesize", {"a": 1}, 12, 0)
    assert merge_data(header, b'{"text":"x"}') == {"a": 1, "text": "x"}
    assert merge_data(parse_header(b'{"type":"describe"}', BOUNDS), b"") == {}
    assert parse_header(b'{"type":"x","data":null,"payload_length":null}', BOUNDS).data == {}


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"not json\n", ErrorCode.INVALID_JSON),
        (b"\n", ErrorCode.INVALID_JSON),
        (b"[1, 2]\n", ErrorCode.INVALID_MESSAGE),
        (b'{"data": {}}\n', ErrorCode.MISSING_FIELD),
        (b'{"type": 7}\n', ErrorCode.INVALID_FIELD),
        (b'{"type": "x", "data": [1]}\n', ErrorCode.INVALID_FIELD),
        (b'{"type": "x", "data_length": "12"}\n', ErrorCode.INVALID_FIELD),
        (b'{"type": "x", "data_length": -1}\n', ErrorCode.INVALID_FIELD),
        (b'{"type": "x", "data_length": 1.5}\n', ErrorCode.INVALID_FIELD),
        (b'{"type": "x", "payload_length": true}\n', ErrorCode.INVALID_FIELD),
        (b'{"type": "x", "data_length": 101}\n', ErrorCode.MESSAGE_TOO_BIG),
        (b'{"type": "x", "payload_length": 51}\n', ErrorCode.MESSAGE_TOO_BIG),
        (b'{"type": "x", "data_length": 9223372036854775807}\n', ErrorCode.MESSAGE_TOO_BIG),
    ],
)
def test_bad_headers_are_refused_with_a_code(line: bytes, code: ErrorCode) -> None:
    with pytest.raises(FramingError) as info:
        parse_header(line, BOUNDS)
    assert info.value.code == code and info.value.message


@pytest.mark.parametrize(
    ("block", "code"), [(b"{nope", ErrorCode.INVALID_JSON), (b'"text"', ErrorCode.INVALID_MESSAGE)]
)
def test_bad_data_blocks_are_refused(block: bytes, code: ErrorCode) -> None:
    header = parse_header(b'{"type": "x", "data_length": 6}', BOUNDS)
    with pytest.raises(FramingError) as info:
        merge_data(header, block)
    assert info.value.code == code


async def test_what_is_written_reads_back_with_the_wyoming_reader() -> None:
    chunk = AudioChunk(rate=22050, width=2, channels=1, audio=b"\x01\x02" * 10, timestamp=5)
    reader = asyncio.StreamReader()
    reader.feed_data(encode_event(chunk.event()))
    reader.feed_eof()
    event = await async_read_event(reader)
    assert event is not None and AudioChunk.from_event(event) == chunk
