"""The native WebSocket protocol end to end: a real server, the real voice, a real client."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from streamtts.audio import decode_samples
from tests.ws_client import StreamClient

SENTENCE_12_WORDS = "The quick brown fox jumps over the lazy dog near the river bank."
LONG_TEXT = " ".join(
    [
        "Once upon a time, in a small village by the sea, there lived an old fisherman.",
        "Every morning he rowed his little boat out past the rocks to cast his nets.",
        "The villagers said he knew the moods of the water better than anyone alive.",
        "One winter the storms came early and stayed for many long and bitter weeks.",
    ]
)
BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}


@pytest.fixture
def ws_url(live_server: str) -> str:
    return live_server.replace("http://", "ws://")


async def open_client(ws_url: str) -> StreamClient:
    return await StreamClient.open(ws_url)


async def test_a_sentence_yields_seconds_of_non_silent_audio(ws_url: str) -> None:
    client = await open_client(ws_url)
    result = await client.speak("c1", SENTENCE_12_WORDS)
    await client.close()

    samples = decode_samples(bytes(result.audio), "pcm_s16le")
    duration_s = samples.size / 24000
    assert 2.0 <= duration_s <= 8.0
    rms = float(np.sqrt(np.mean(samples**2)))
    assert rms > 0.02, rms
    # Speech, not a burst: most 100 ms windows carry energy.
    windows = samples[: samples.size // 2400 * 2400].reshape(-1, 2400)
    voiced = np.sqrt((windows**2).mean(axis=1)) > 0.01
    assert voiced.mean() > 0.5

    assert result.of_type("started") == [
        {
            "type": "started",
            "context": "c1",
            "sample_rate": 24000,
            "encoding": "pcm_s16le",
            "channels": 1,
        }
    ]
    segments = result.of_type("segment")
    assert " ".join(s["text"] for s in segments) == SENTENCE_12_WORDS
    assert segments[-1]["end_ms"] == pytest.approx(duration_s * 1000, abs=0.1)
    done = result.done
    assert done is not None and done["reason"] == "end"
    assert done["stats"]["audio_ms"] == pytest.approx(duration_s * 1000, abs=0.1)
    assert 0 < done["stats"]["ttfa_ms"] < 5000
    assert 0 < done["stats"]["rtf"] < 1


@pytest.mark.parametrize("encoding", sorted(BYTES_PER_SAMPLE))
async def test_every_encoding_and_rate_has_the_right_byte_count(ws_url: str, encoding: str) -> None:
    client = await open_client(ws_url)
    durations_s = []
    for rate in (8000, 11025, 16000, 22050, 24000, 44100, 48000):
        result = await client.speak(f"{encoding}-{rate}", "Testing one two three.", encoding, rate)
        done = result.done
        assert done is not None and done["reason"] == "end"
        nbytes = len(result.audio)
        assert nbytes % BYTES_PER_SAMPLE[encoding] == 0
        samples = nbytes // BYTES_PER_SAMPLE[encoding]
        # The server counts the samples it resampled; the client counts bytes: they agree.
        assert samples / rate * 1000 == pytest.approx(done["stats"]["audio_ms"], abs=0.1)
        decoded = decode_samples(bytes(result.audio), encoding)
        assert decoded.size == samples
        assert float(np.abs(decoded).max()) > 0.1
        durations_s.append(samples / rate)
    await client.close()
    # Every rate speaks the same sentence for about as long. Piper's durations vary by up to a
    # third between runs (measured 1.31-1.74 s), so each is compared with the median: one
    # wrong conversion (16 <-> 24 kHz is 1.5x, 22.05 <-> 44.1 kHz 2x) stands out from it.
    median_s = float(np.median(durations_s))
    assert all(1 / 1.4 < d / median_s < 1.4 for d in durations_s), durations_s


async def test_two_interleaved_contexts_each_get_their_own_audio(ws_url: str) -> None:
    client = await open_client(ws_url)
    first = "The first context talks about apples and pears in the garden."
    second = "Meanwhile the second context is all about trains and stations."
    await client.send(type="start", context="a", format={"sample_rate": 16000})
    await client.send(type="start", context="b", format={"encoding": "pcm_f32le"})
    words_a, words_b = first.split(), second.split()
    for i in range(max(len(words_a), len(words_b))):
        if i < len(words_a):
            await client.send(type="text", context="a", text=words_a[i] + " ")
        if i < len(words_b):
            await client.send(type="text", context="b", text=words_b[i] + " ")
    await client.send(type="end", context="a")
    await client.send(type="end", context="b")
    await client.until_done("a")
    if client.contexts["b"].done is None:
        await client.until_done("b")
    await client.close()

    a, b = client.contexts["a"], client.contexts["b"]
    assert " ".join(s["text"] for s in a.of_type("segment")) == first
    assert " ".join(s["text"] for s in b.of_type("segment")) == second
    seconds_a = len(a.audio) / 2 / 16000
    seconds_b = len(b.audio) / 4 / 24000
    assert 1.5 < seconds_a < 8 and 1.5 < seconds_b < 8
    assert a.done is not None and b.done is not None
    assert a.done["stats"]["audio_ms"] == pytest.approx(seconds_a * 1000, abs=0.1)
    assert b.done["stats"]["audio_ms"] == pytest.approx(seconds_b * 1000, abs=0.1)


async def test_cancel_mid_stream_stops_audio_and_reports_cancel(ws_url: str) -> None:
    client = await open_client(ws_url)
    await client.send(type="start", context="long")
    await client.send(type="text", context="long", text=LONG_TEXT)
    await client.send(type="end", context="long")
    while client.contexts["long"].first_audio_s is None:
        await client.receive_one()
    await client.send(type="cancel", context="long")
    result = await client.until_done("long")
    done = result.done
    assert done is not None and done["reason"] == "cancel"
    # Nothing after done, even if we keep listening for a moment.
    with pytest.raises(TimeoutError):
        await client.receive_one(timeout_s=1.0)
    assert result.audio_after_done == 0
    full_s = len(LONG_TEXT.split()) / 2.5  # roughly how long the whole text would take
    assert len(result.audio) / 2 / 24000 < full_s * 0.75
    # The id is free again and the socket still works.
    again = await client.speak("long", "Still here.")
    assert again.of_type("done")[-1]["reason"] == "end"
    await client.close()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{this is not json", "invalid_json"),
        ('{"type": "sing", "context": "x"}', "unknown_type"),
        ('{"type": "text", "text": "hello"}', "missing_field"),
        ('{"type": "text", "context": "x", "text": 42}', "invalid_field"),
        ('{"type": "start", "context": 7}', "invalid_field"),
        ('{"type": "text", "context": "never-started", "text": "hi"}', "unknown_context"),
        ('{"type": "start", "context": "x", "format": {"encoding": "ogg"}}', "unsupported_format"),
        ('{"type": "start", "context": "x", "voice": "nobody"}', "unknown_voice"),
        ("[]", "invalid_message"),
    ],
)
async def test_malformed_messages_get_documented_errors_and_socket_stays_usable(
    ws_url: str, frame: str, code: str
) -> None:
    client = await open_client(ws_url)
    await client.ws.send(frame)
    message = await client.until(lambda m: m["type"] == "error")
    assert message["code"] == code
    assert message["message"]
    result = await client.speak("ok", "Yes.")
    assert result.done is not None and result.done["reason"] == "end"
    assert len(result.audio) > 0
    await client.close()


async def test_binary_frames_and_protocol_misuse_are_errors(ws_url: str) -> None:
    client = await open_client(ws_url)
    await client.ws.send(b"\x00\x01binary")
    assert (await client.until(lambda m: m["type"] == "error"))["code"] == "binary_not_supported"
    await client.send(type="start", context="dup")
    await client.until(lambda m: m["type"] == "started")
    await client.send(type="start", context="dup")
    assert (await client.until(lambda m: m["type"] == "error"))["code"] == "context_exists"
    await client.send(type="end", context="dup")
    await client.send(type="text", context="dup", text="late")
    late = await client.until(lambda m: m["type"] == "error" or m["type"] == "done")
    # Either the context was still finishing (context_ended) or already gone (unknown_context).
    if late["type"] == "error":
        assert late["code"] in ("context_ended", "unknown_context")
    await client.close()


async def test_flush_speaks_buffered_text_and_acknowledges(ws_url: str) -> None:
    client = await open_client(ws_url)
    await client.send(type="start", context="f")
    await client.send(type="text", context="f", text="No sentence end here")
    await client.send(type="flush", context="f")
    await client.until(lambda m: m["type"] == "flushed")
    result = client.contexts["f"]
    assert [s["text"] for s in result.of_type("segment")] == ["No sentence end here"]
    assert len(result.audio) > 24000  # more than half a second of s16 audio
    await client.send(type="cancel", context="f")
    await client.until_done("f")
    await client.close()


async def test_contexts_on_separate_sockets_run_concurrently(ws_url: str) -> None:
    async def one(i: int) -> float:
        client = await open_client(ws_url)
        result = await client.speak(f"s{i}", SENTENCE_12_WORDS)
        await client.close()
        return len(result.audio) / 2 / 24000

    durations = await asyncio.gather(*(one(i) for i in range(3)))
    assert all(2.0 < d < 8.0 for d in durations)


async def test_the_server_declines_to_compress_frames(ws_url: str) -> None:
    """A client offers permessage-deflate by default; audio does not compress, and compressing
    it would cost the CPU that synthesis runs on, so the server does not accept the offer."""
    from websockets.asyncio.client import connect

    async with connect(ws_url + "/v1/stream") as ws:
        assert ws.request is not None and ws.response is not None
        assert "permessage-deflate" in ws.request.headers.get("Sec-WebSocket-Extensions", "")
        assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
