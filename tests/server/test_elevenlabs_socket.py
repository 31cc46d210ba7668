"""ElevenLabs' stream-input and multi-stream-input end to end on the wire: the real app on a real
uvicorn in process, a fake engine, a raw WebSocket client sending what the real clients send."""

from __future__ import annotations

import asyncio
import io
import socket
import time
from typing import Any

import av
import httpx
import pytest
from websockets.asyncio.client import connect

from streamtts.config import Settings
from streamtts.server.metrics import parse_exposition
from tests.app_server import RunningApp, serve_app
from tests.fake_engine import FAIL, FakeEngine, FakeStream
from tests.json_socket import JsonSocket, audio_of
from tests.wire import WireRecorder

RATE_HZ = 16_000
SAMPLES_PER_CHAR = 40
PIPECAT_QUERY = "model_id=eleven_flash_v2_5&output_format=pcm_16000&auto_mode=true"


def engine(chunk_delay_s: float = 0.0, samples_per_char: int = SAMPLES_PER_CHAR) -> FakeEngine:
    return FakeEngine(
        rate_hz=RATE_HZ,
        samples_per_char=samples_per_char,
        chunk_samples=800,
        chunk_delay_s=chunk_delay_s,
    )


def spoken_samples(stream: FakeStream, samples_per_char: int = SAMPLES_PER_CHAR) -> int:
    """What the fake engine made of the segments it was given."""
    return sum(len(s) for s in stream.segments) * samples_per_char


def stream_input(app: RunningApp, query: str = "output_format=pcm_16000") -> str:
    return f"{app.ws_url}/v1/text-to-speech/default/stream-input?{query}"


def multi(app: RunningApp, query: str = PIPECAT_QUERY, voice: str = "default") -> str:
    return f"{app.ws_url}/v1/text-to-speech/{voice}/multi-stream-input?{query}"


async def sdk_utterance(ws: JsonSocket, chunks: list[str]) -> list[dict[str, Any]]:
    """What ``convert_realtime`` sends, then everything until the server closes."""
    await ws.send(
        text=" ",
        try_trigger_generation=True,
        voice_settings=None,
        generation_config={"chunk_length_schedule": [50]},
    )
    for chunk in chunks:
        await ws.send(text=chunk, try_trigger_generation=True)
    await ws.send(text="")
    return await ws.until_closed()


SDK_CHUNKS = ["Hello ", "there, ", " this ", "is a ", "streaming ", "test. ", "It ", "works. "]


# ---- stream-input ----


async def test_stream_input_speaks_the_text_then_is_final_then_closes_with_1000() -> None:
    fake = engine()
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(stream_input(app))
        messages = await sdk_utterance(ws, SDK_CHUNKS)
    assert ws.close_code == 1000
    assert messages[-1] == {"isFinal": True}
    assert all(m.get("audio") for m in messages[:-1])
    [stream] = fake.streams
    # Whitespace runs are spoken as one space; the text arrives whole and in order.
    assert " ".join(stream.segments) == "Hello there, this is a streaming test. It works."
    assert len(audio_of(messages)) == 2 * spoken_samples(stream)


@pytest.mark.parametrize(("fmt", "rate_hz"), [("ulaw_8000", 8000), ("alaw_8000", 8000)])
async def test_g711_formats_are_one_byte_per_sample(fmt: str, rate_hz: int) -> None:
    fake = engine()
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(stream_input(app, f"output_format={fmt}"))
        messages = await sdk_utterance(ws, ["Phone call audio. "])
    [stream] = fake.streams
    expected = spoken_samples(stream) * rate_hz // RATE_HZ
    assert len(audio_of(messages)) == pytest.approx(expected, abs=2)


async def test_mp3_by_default_streams_one_decodable_mp3_per_context() -> None:
    fake = engine(chunk_delay_s=0.01, samples_per_char=400)  # 25 ms a character
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(stream_input(app, "model_id=eleven_flash_v2_5"))
        messages = await sdk_utterance(ws, SDK_CHUNKS)
    assert ws.close_code == 1000
    audio_messages = [m for m in messages if m.get("audio")]
    assert len(audio_messages) > 3  # streamed, not one file at the end
    container = av.open(io.BytesIO(audio_of(messages)), format="mp3")
    stream = container.streams.audio[0]
    assert stream.codec_context.sample_rate == 44100
    assert stream.codec_context.bit_rate == 128_000
    decoded = sum(frame.samples for frame in container.decode(stream))
    expected = spoken_samples(fake.streams[0], 400) * 44100 // RATE_HZ
    # The codec adds its priming delay and pads the last frame (1152 samples per frame).
    assert expected <= decoded <= expected + 3 * 1152


async def test_a_bad_message_mid_utterance_is_answered_and_the_utterance_goes_on() -> None:
    async with serve_app(engine()) as app:
        ws = await JsonSocket.open(stream_input(app))
        await ws.send(text=" ")
        await ws.ws.send("{broken")
        error = await ws.recv()
        assert error["error"] == "invalid_json" and error["message"] and "code" not in error
        await ws.send(text="Still speaking. ", flush=True)
        await ws.send(text="")
        messages = await ws.until_closed()
        assert messages[-1] == {"isFinal": True} and audio_of(messages)
        assert ws.close_code == 1000


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("/v1/text-to-speech/nobody/stream-input", "unknown_voice"),
        (
            "/v1/text-to-speech/default/stream-input?output_format=opus_48000_64",
            "unsupported_format",
        ),
        ("/v1/text-to-speech/default/multi-stream-input?enable_ssml_parsing=true", "invalid_field"),
        ("/v1/text-to-speech/default/multi-stream-input?inactivity_timeout=999", "invalid_field"),
    ],
)
async def test_what_the_url_asks_for_is_checked_at_once(url: str, error: str) -> None:
    async with serve_app(engine()) as app:
        ws = await JsonSocket.open(app.ws_url + url)
        [message] = await ws.until_closed()
    assert message["error"] == error and message["code"] == 1008 and message["message"]
    assert ws.close_code == 1008


async def test_a_failed_utterance_closes_with_1011() -> None:
    async with serve_app(engine()) as app:
        ws = await JsonSocket.open(stream_input(app))
        messages = await sdk_utterance(ws, [f"This one {FAIL} breaks. "])
    assert messages[-1]["error"] == "internal" and messages[-1]["code"] == 1011
    assert ws.close_code == 1011


# ---- multi-stream-input ----


async def test_pipecat_turns_drain_and_the_socket_stays_open_across_them() -> None:
    fake = engine()
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(multi(app))
        for turn in ("t1", "t2"):
            await ws.send(text=" ", context_id=turn)
            await ws.send(text="This is a speech test.", context_id=turn)
            await ws.send(text="It checks the turns.", context_id=turn)
            await ws.send(context_id=turn, flush=True)
            await ws.send(context_id=turn, close_context=True)
            messages = await ws.until(lambda m: m.get("isFinal") is True)
            assert messages[-1] == {"isFinal": True, "contextId": turn}
            assert {m["contextId"] for m in messages} == {turn}
            stream = fake.streams[-1]
            assert stream.segments == ["This is a speech test.", "It checks the turns."]
            assert len(audio_of(messages)) == 2 * spoken_samples(stream)
            await ws.send(text="")  # pipecat's keepalive ends nothing
        await ws.send(close_socket=True)
        assert await ws.until_closed() == []
    assert ws.close_code == 1000


async def test_close_context_without_a_flush_is_a_barge_in_that_stops_generation() -> None:
    fake = engine(chunk_delay_s=0.05)  # 20 chunks of 50 ms: seconds of work to interrupt
    wire = WireRecorder()
    async with serve_app(fake, wrap=wire.wrap) as app:
        ws = await JsonSocket.open(multi(app))
        await ws.send(text=" ", context_id="talk")
        await ws.send(text="A long answer. " * 20, context_id="talk")
        await ws.until(lambda m: bool(m.get("audio")))
        await ws.send(context_id="talk", close_context=True)
        await ws.until(lambda m: m.get("isFinal") is True)
        # The next turn on the same socket works.
        await ws.send(text=" ", context_id="next")
        await ws.send(text="Next turn.", context_id="next", flush=True)
        await ws.send(context_id="next", close_context=True)
        after = await ws.until(lambda m: m.get("isFinal") is True)
        assert audio_of(after) and {m["contextId"] for m in after} == {"next"}
        await ws.close()
    talk = fake.streams[0]
    assert talk.cancelled_at is not None
    # Generation stopped at once: no chunk was made after the cancel.
    assert not [t for t in talk.chunk_times if t > talk.cancelled_at]
    assert len(talk.chunk_times) < 20 * len("A long answer. ") * SAMPLES_PER_CHAR // 800
    # On the wire: after the close_context, only its isFinal for that context.
    [conn] = wire.connections
    closed_at = next(f.t for f in conn.frames if f.incoming and "close_context" in (f.text or ""))
    later = [m for f in conn.frames if not f.incoming and f.t >= closed_at and (m := f.json())]
    assert [m for m in later if m.get("contextId") == "talk"] == [
        {"isFinal": True, "contextId": "talk"}
    ]


async def test_livekit_sentences_with_flush_then_close_deliver_everything_then_is_final() -> None:
    fake = engine(chunk_delay_s=0.01)
    query = (
        "model_id=eleven_turbo_v2_5&output_format=pcm_16000&enable_ssml_parsing=false"
        "&enable_logging=true&inactivity_timeout=180&apply_text_normalization=auto"
        "&sync_alignment=true&auto_mode=true"
    )
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(multi(app, query))
        await ws.send(text=" ", voice_settings={}, context_id="lk")
        await ws.send(text="First sentence here. ", context_id="lk", flush=True)
        await ws.send(text="And a second one. ", context_id="lk", flush=True)
        await ws.send(text="", context_id="lk", flush=True)
        await ws.send(context_id="lk", close_context=True)
        messages = await ws.until(lambda m: m.get("isFinal") is True)
    [stream] = fake.streams
    assert stream.cancelled_at is None  # drained, not cut
    assert len(audio_of(messages)) == 2 * spoken_samples(stream)
    assert stream.segments == ["First sentence here.", "And a second one."]


async def test_bad_messages_are_answered_and_leave_the_other_contexts_unharmed() -> None:
    fake = engine(chunk_delay_s=0.01)
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(multi(app))
        await ws.send(text=" ", context_id="good")
        await ws.send(text="The good context keeps speaking.", context_id="good")
        bad: list[tuple[Any, str]] = [
            ("{not json", "invalid_json"),
            ("[1, 2]", "invalid_message"),
            ('{"text": "Hi", "context_id": 7}', "invalid_field"),
            ('{"text": "Hi"}', "missing_field"),
            ('{"text": 5, "context_id": "x"}', "invalid_field"),
            ('{"context_id": "ghost", "flush": true}', "unknown_context"),
            (b"\x00\x01", "binary_not_supported"),
        ]
        for frame, code in bad:
            await ws.ws.send(frame)
            reply = await ws.until(lambda m: "error" in m)
            assert reply[-1]["error"] == code and reply[-1]["message"]
            assert "code" not in reply[-1]  # the socket stays open
        await ws.send(context_id="closing", text=" ")
        await ws.send(context_id="closing", close_context=True)
        await ws.send(context_id="closing", text="text after close")
        late = await ws.until(lambda m: "error" in m)
        assert late[-1] == {
            "message": late[-1]["message"],
            "error": "context_ended",
            "contextId": "closing",
        }
        await ws.send(context_id="good", flush=True)
        await ws.send(context_id="good", close_context=True)
        rest = await ws.until(lambda m: m == {"isFinal": True, "contextId": "good"})
        everything = ws.received
        assert audio_of([m for m in everything if m.get("contextId") == "good"])
        assert not any(m.get("error") and m.get("contextId") == "good" for m in everything)
        assert rest[-1]["isFinal"] is True
    assert fake.streams[0].cancelled_at is None


async def test_every_closed_context_gets_its_is_final_even_an_unknown_one() -> None:
    async with serve_app(engine()) as app:
        ws = await JsonSocket.open(multi(app))
        await ws.send(context_id="never-opened", close_context=True)
        assert await ws.recv() == {"isFinal": True, "contextId": "never-opened"}


async def test_contexts_per_socket_and_admission_limits_refuse_with_is_final() -> None:
    settings = Settings().replace(max_contexts_per_socket=2, max_active_contexts=3)
    async with serve_app(engine(chunk_delay_s=0.05), settings) as app:
        ws = await JsonSocket.open(multi(app))
        for context in ("a", "b", "c"):
            await ws.send(text="Hold on.", context_id=context)
        refused = await ws.until(lambda m: m.get("isFinal") is True)
        assert [m for m in refused if "error" in m][0]["error"] == "too_many_contexts"
        assert refused[-1] == {"isFinal": True, "contextId": "c"}
        other = await JsonSocket.open(multi(app))
        await other.send(text="One more.", context_id="d")
        await other.send(text="And more.", context_id="e")
        full = await other.until(lambda m: m.get("isFinal") is True)
        assert [m["error"] for m in full if "error" in m] == ["overloaded"]
        assert full[-1]["contextId"] == "e"
        # A new socket while the server is full: refused the protocol's way.
        third = await JsonSocket.open(multi(app))
        [message] = await third.until_closed()
        assert message["error"] == "overloaded" and message["code"] == 1013
        assert third.close_code == 1013
        async with httpx.AsyncClient() as http:
            metrics = parse_exposition((await http.get(app.url + "/metrics")).text)
    assert metrics['streamtts_rejected_total{cause="overloaded"}'] == 1
    assert metrics['streamtts_errors_total{code="overloaded"}'] == 1
    assert metrics['streamtts_errors_total{code="too_many_contexts"}'] == 1


async def test_inactivity_timeout_closes_with_1008_after_saying_so() -> None:
    async with serve_app(engine()) as app:
        ws = await JsonSocket.open(multi(app, PIPECAT_QUERY + "&inactivity_timeout=1"))
        await ws.send(text=" ", context_id="idle")
        [message] = await ws.until_closed(timeout_s=10)
    assert message["error"] == "input_timeout_exceeded" and message["code"] == 1008
    assert ws.close_code == 1008


async def test_shutdown_ends_open_contexts_with_an_error_then_closes_with_1001() -> None:
    async with serve_app(engine(chunk_delay_s=0.05)) as app:
        ws = await JsonSocket.open(multi(app))
        await ws.send(text="A long answer. " * 10, context_id="busy")
        await ws.until(lambda m: bool(m.get("audio")))
        app.state.lifecycle.begin_drain(0.0)
        messages = await ws.until_closed()
        assert [m for m in messages if "error" in m] == [
            {
                "message": "the server is shutting down; reconnect to another instance",
                "error": "shutting_down",
                "contextId": "busy",
            }
        ]
        assert ws.close_code == 1001
        await asyncio.wait_for(app.state.lifecycle.drained.wait(), 10)


async def test_a_slow_reader_loses_only_its_own_context() -> None:
    """The outbox's bound holds for this protocol too: a context whose audio the client does
    not take ends with ``slow_consumer`` and its ``isFinal``; other sockets are served."""
    fake = engine(samples_per_char=400)  # 25 ms of audio a character
    settings = Settings().replace(max_output_buffer_ms=2000)
    async with serve_app(fake, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(app.url.rsplit(":", 1)[1])))
        sock.setblocking(False)
        query = "output_format=pcm_48000&auto_mode=true"  # 96 kB a second of audio
        slow = JsonSocket(await connect(multi(app, query), sock=sock, max_queue=1, max_size=None))
        for _ in range(12):  # 45 s of audio, 6 MB of frames: more than the socket buffers
            await slow.send(text="A sentence that takes a while to say. " * 4, context_id="slow")
        deadline = time.monotonic() + 60
        while True:
            figures = parse_exposition((await http.get("/metrics")).text)
            if figures.get('streamtts_errors_total{code="slow_consumer"}', 0) >= 1:
                break
            assert time.monotonic() < deadline, "no slow_consumer within 60 s"
            await asyncio.sleep(0.2)
        assert figures["streamtts_output_buffer_bytes"] == 0 and not fake.open_streams
        other = await JsonSocket.open(multi(app))
        await other.send(text="Others are served.", context_id="ok", flush=True)
        await other.send(context_id="ok", close_context=True)
        assert audio_of(await other.until(lambda m: m.get("isFinal") is True))
        late = await slow.until(lambda m: m.get("isFinal") is True)
        assert [m["error"] for m in late if "error" in m] == ["slow_consumer"]
        assert late[-1] == {"isFinal": True, "contextId": "slow"}
