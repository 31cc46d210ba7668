"""Cartesia's ``/tts/websocket`` end to end on the wire: the real app on a real uvicorn in process,
a fake engine, a raw WebSocket client sending what the SDK and Pipecat send."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.exceptions import InvalidStatus

from streamtts.audio import decode_samples
from streamtts.config import Settings
from streamtts.server.metrics import parse_exposition
from tests.app_server import RunningApp, serve_app
from tests.cartesia_messages import F32_44K, pipecat, sdk_push
from tests.fake_engine import FAIL, FakeEngine, FakeStream
from tests.json_socket import JsonSocket, audio_of
from tests.wire import WireRecorder

RATE_HZ = 16_000
SAMPLES_PER_CHAR = 40
SDK_HEADERS = {"Cartesia-Version": "2026-08-14", "X-Cartesia-Client": "cartesia-python/4.2.0"}
PIPECAT_HEADERS = {"Cartesia-Version": "2026-03-01"}


def engine(chunk_delay_s: float = 0.0) -> FakeEngine:
    return FakeEngine(
        rate_hz=RATE_HZ,
        samples_per_char=SAMPLES_PER_CHAR,
        chunk_samples=800,
        chunk_delay_s=chunk_delay_s,
    )


def spoken_samples(stream: FakeStream, rate_hz: int) -> int:
    return sum(len(s) for s in stream.segments) * SAMPLES_PER_CHAR * rate_hz // RATE_HZ


def url(app: RunningApp) -> str:
    return app.ws_url + "/tts/websocket"


def of(context: str) -> Any:
    return lambda m: m.get("context_id") == context and m["type"] in ("done", "error")


async def test_sdk_pieces_a_flush_and_the_end_in_f32_at_44100() -> None:
    fake = engine()
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(url(app), SDK_HEADERS)
        for piece in ("Hello there, this ", "is a streaming ", "test. "):
            await ws.send(**sdk_push("c1", piece))
        await ws.send(**sdk_push("c1", "Now a flush.", flush=True))
        await ws.send(**sdk_push("c1", "", more=False))
        messages = await ws.until(of("c1"))
    assert all(m["context_id"] == "c1" and "type" in m for m in messages)
    kinds = [m["type"] for m in messages]
    assert kinds[-1] == "done" and kinds.count("flush_done") == 1
    flush_at = kinds.index("flush_done")
    assert messages[flush_at]["flush_id"] == 1
    assert all("flush_id" not in m for m in messages[:flush_at])
    [stream] = fake.streams
    assert stream.segments == ["Hello there, this is a streaming test.", "Now a flush."]
    samples = decode_samples(audio_of(messages, "data"), "pcm_f32le")
    assert samples.size == pytest.approx(spoken_samples(stream, 44100), abs=2)
    assert np.abs(samples).max() > 0.1


async def test_pipecat_sentences_are_spoken_as_they_arrive_joined_with_spaces() -> None:
    fake = engine(chunk_delay_s=0.01)
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(url(app), PIPECAT_HEADERS | {"X-API-Key": "unused"})
        await ws.send(**pipecat("p", "This is a speech test."))
        # max_buffer_delay_ms 0: the first sentence speaks before the turn ends.
        await ws.until(lambda m: m["type"] == "chunk")
        await ws.send(**pipecat("p", "It checks the turns."))
        await ws.send(**pipecat("p", "", more=False))
        messages = await ws.until(of("p"))
    assert messages[-1]["type"] == "done"
    assert not [m for m in ws.received if m["type"] == "flush_done"]  # only the client's flushes
    [stream] = fake.streams
    assert stream.segments == ["This is a speech test.", "It checks the turns."]
    assert len(audio_of(ws.received, "data")) == 2 * spoken_samples(stream, 24000)


async def test_cancel_stops_generation_and_nothing_more_comes_for_that_context() -> None:
    fake = engine(chunk_delay_s=0.05)
    wire = WireRecorder()
    async with serve_app(fake, wrap=wire.wrap) as app:
        ws = await JsonSocket.open(url(app), SDK_HEADERS)
        await ws.send(**pipecat("long", "A long answer. " * 20))
        await ws.send(**pipecat("other", "Another context."))
        await ws.until(lambda m: m["context_id"] == "long" and m["type"] == "chunk")
        await ws.send(context_id="long", cancel=True)
        await ws.send(**pipecat("other", "", more=False))
        await ws.until(of("other"))
        await ws.send(**pipecat("after", "The socket stays open.", more=False))
        await ws.until(of("after"))
        await ws.close()
    long = fake.streams[0]
    assert long.cancelled_at is not None
    assert not [t for t in long.chunk_times if t > long.cancelled_at]
    [conn] = wire.connections
    cancelled = next(f.t for f in conn.frames if f.incoming and '"cancel"' in (f.text or ""))
    late = [m for f in conn.frames if not f.incoming and f.t >= cancelled and (m := f.json())]
    assert not [m for m in late if m["context_id"] == "long"]  # not even done
    assert [m["type"] for m in late if m["context_id"] == "after"][-1] == "done"


async def test_errors_carry_the_context_and_end_it_and_other_contexts_go_on() -> None:
    fake = engine(chunk_delay_s=0.01)
    async with serve_app(fake) as app:
        ws = await JsonSocket.open(url(app), SDK_HEADERS)
        await ws.send(**sdk_push("good", "The good context keeps speaking."))
        await ws.ws.send("{not json")
        [error] = await ws.until(lambda m: m["type"] == "error")
        assert error["context_id"] is None and error["error_code"] == "invalid_json"
        assert error["status_code"] == 400 and error["title"] == "Bad Request"
        await ws.send(**{**sdk_push("bad", "x"), "output_format": {**F32_44K, "sample_rate": 1}})
        [error] = await ws.until(lambda m: m["type"] == "error")
        assert error["context_id"] == "bad" and error["error_code"] == "unsupported_format"
        await ws.send(**{**sdk_push("who", "x"), "voice": {"mode": "id", "id": "nobody"}})
        [error] = await ws.until(lambda m: m["type"] == "error")
        assert error["context_id"] == "who" and error["error_code"] == "unknown_voice"
        await ws.send(**sdk_push("ended", "Short.", more=False))
        await ws.send(**sdk_push("ended", "text after the end"))
        ended = await ws.until(of("ended"))
        assert ended[-1]["type"] == "error" and ended[-1]["error_code"] == "context_ended"
        await ws.send(**sdk_push("broken", f"This {FAIL} fails."))
        await ws.send(**sdk_push("broken", "", more=False))
        broken = await ws.until(of("broken"))
        assert broken[-1]["type"] == "error" and broken[-1]["status_code"] == 500
        await ws.send(**sdk_push("good", "", more=False))
        good = await ws.until(of("good"))
        assert good[-1]["type"] == "done" and audio_of(good, "data")
        await asyncio.sleep(0.2)
        await ws.send(**sdk_push("probe", "", more=False))
        await ws.until(of("probe"))
    # Nothing followed an error for its context (its done: true).
    for context in ("ended", "broken"):
        mine = [m for m in ws.received if m["context_id"] == context]
        assert mine[-1]["type"] == "error" and [m["type"] for m in mine].count("error") == 1


async def test_admission_refuses_a_context_with_429_and_a_socket_at_the_handshake() -> None:
    settings = Settings().replace(max_active_contexts=1)
    async with serve_app(engine(chunk_delay_s=0.05), settings) as app:
        ws = await JsonSocket.open(url(app), SDK_HEADERS)
        await ws.send(**sdk_push("a", "Hold the only slot."))
        await ws.send(**sdk_push("b", "No room."))
        [error] = await ws.until(lambda m: m["type"] == "error")
        assert error["context_id"] == "b" and error["status_code"] == 429
        assert error["error_code"] == "overloaded"
        with pytest.raises(InvalidStatus) as refused:
            await JsonSocket.open(url(app), SDK_HEADERS)
        assert refused.value.response.status_code == 429
        async with httpx.AsyncClient() as http:
            metrics = parse_exposition((await http.get(app.url + "/metrics")).text)
    assert metrics['streamtts_rejected_total{cause="overloaded"}'] == 1


async def test_shutdown_ends_contexts_with_an_error_then_closes_with_1001() -> None:
    async with serve_app(engine(chunk_delay_s=0.05)) as app:
        ws = await JsonSocket.open(url(app), SDK_HEADERS)
        await ws.send(**sdk_push("busy", "A long answer. " * 10))
        await ws.until(lambda m: m["type"] == "chunk")
        app.state.lifecycle.begin_drain(0.0)
        messages = await ws.until_closed()
        errors = [m for m in messages if m["type"] == "error"]
        assert [(m["context_id"], m["status_code"]) for m in errors] == [("busy", 503)]
        assert ws.close_code == 1001
        await asyncio.wait_for(app.state.lifecycle.drained.wait(), 10)
        with pytest.raises(InvalidStatus) as refused:
            await JsonSocket.open(url(app), SDK_HEADERS)
        assert refused.value.response.status_code == 503
