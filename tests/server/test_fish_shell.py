"""The Fish Audio API's shells in process, with a fake engine: the body streams as synthesised,
bad bodies get the documented 4xx without harming anything, options reach the engine or are
refused by it, admission and draining; the live socket's bad frames, flush, disconnects and
shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import msgpack
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from streamtts.config import Settings
from streamtts.options import FISH, SynthesisOptions
from tests.app_server import RunningApp, serve_app, until
from tests.fake_engine import FakeEngine

MSGPACK = {"content-type": "application/msgpack"}
WAIT_S = 30.0


def packed(body: dict[str, Any]) -> bytes:
    return bytes(msgpack.packb(body, use_bin_type=True))


# ---- POST /v1/tts ---------------------------------------------------------------------------


async def test_the_body_streams_in_chunks_as_it_is_synthesised() -> None:
    engine = FakeEngine(rate_hz=16_000, chunk_delay_s=0.01)
    async with serve_app(engine) as app, httpx.AsyncClient(base_url=app.url) as http:
        body = packed({"text": "One sentence here. And a second one.", "format": "pcm"})
        async with http.stream("POST", "/v1/tts", content=body, headers=MSGPACK) as response:
            assert response.status_code == 200
            assert response.headers["transfer-encoding"] == "chunked"
            chunks = [c async for c in response.aiter_raw()]
        assert len(chunks) > 3
        samples = sum(len(c) for c in chunks) // 2  # 16-bit PCM at the engine's rate
        assert samples == len("One sentence here.And a second one.") * engine.samples_per_char
        assert app.state.admission.active == 0


async def test_json_bodies_the_model_header_and_sample_rates() -> None:
    engine = FakeEngine(rate_hz=16_000)
    async with serve_app(engine) as app, httpx.AsyncClient(base_url=app.url) as http:
        response = await http.post(
            "/v1/tts",
            json={"text": "Hello there.", "format": "pcm", "sample_rate": 8000},
            headers={"model": "speech-1.5"},
        )
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        assert len(response.content) // 2 == pytest.approx(12 * 160 / 2, abs=2)  # 8 kHz
        wav = await http.post("/v1/tts", json={"text": "Hello there."})
        assert wav.headers["content-type"] == "audio/wav" and wav.content[:4] == b"RIFF"


async def test_options_reach_a_fish_engine_and_defaults_ask_for_nothing() -> None:
    engine = FakeEngine(kind=FISH)
    async with serve_app(engine) as app, httpx.AsyncClient(base_url=app.url) as http:
        sdk_defaults = {"top_p": 0.7, "temperature": 0.7, "max_new_tokens": 1024}
        ok = await http.post("/v1/tts", json={"text": "Hi.", "format": "pcm", **sdk_defaults})
        seeded = await http.post(
            "/v1/tts", json={"text": "Hi.", "format": "pcm", "seed": 3, "top_p": 0.5}
        )
        assert ok.status_code == seeded.status_code == 200
        assert engine.opened == [SynthesisOptions(), SynthesisOptions(top_p=0.5, seed=3)]
        refused = await http.post("/v1/tts", json={"text": "Hi.", "prosody": {"speed": 1.5}})
        assert refused.status_code == 400
        assert refused.json() == {"status": 400, "message": refused.json()["message"]}
        assert "prosody.speed" in refused.json()["message"]
        assert app.state.admission.active == 0 and len(engine.opened) == 2


@pytest.mark.parametrize(
    ("content", "headers", "status"),
    [
        (b"\xc1\xc1", MSGPACK, 400),
        (b"{not json", {"content-type": "application/json"}, 400),
        (packed({"text": "Hi.", "format": "aiff"}), MSGPACK, 400),
        (packed({"text": "Hi.", "top_p": "high"}), MSGPACK, 400),
        (packed({"text": "Hi.", "references": [{"audio": b"RIFF", "text": "x"}]}), MSGPACK, 400),
        (packed({"text": "Hi.", "surprise": 1}), MSGPACK, 400),
        (packed({"text": "x" * 2_000}), MSGPACK, 413),
    ],
)
async def test_bad_bodies_get_the_documented_4xx_and_harm_nothing(
    content: bytes, headers: dict[str, str], status: int
) -> None:
    engine = FakeEngine()
    settings = Settings().replace(max_http_body_bytes=1_000)
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        response = await http.post("/v1/tts", content=content, headers=headers)
        assert response.status_code == status
        body = response.json()
        assert set(body) == {"status", "message"} and body["status"] == status
        assert body["message"]
        assert engine.opened == [] and app.state.admission.active == 0
        after = await http.post("/v1/tts", json={"text": "Still fine.", "format": "pcm"})
        assert after.status_code == 200 and len(after.content) > 0


async def test_overload_and_draining() -> None:
    engine = FakeEngine(chunk_delay_s=0.05)
    settings = Settings().replace(max_active_contexts=1)
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        body = {"text": "A long sentence that keeps the only ticket busy.", "format": "pcm"}
        async with http.stream("POST", "/v1/tts", json=body) as holding:
            assert holding.status_code == 200
            refused = await http.post("/v1/tts", json={"text": "Me too."})
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["status"] == 429
            await holding.aread()
        app.state.lifecycle.draining = True
        draining = await http.post("/v1/tts", json={"text": "Hi."})
        assert draining.status_code == 503 and draining.json()["status"] == 503
        app.state.lifecycle.draining = False


async def test_a_key_is_needed_when_keys_are_set() -> None:
    settings = Settings().replace(api_keys="s3cret")
    async with (
        serve_app(FakeEngine(), settings) as app,
        httpx.AsyncClient(base_url=app.url) as http,
    ):
        body = {"text": "Hi.", "format": "pcm"}
        assert (await http.post("/v1/tts", json=body)).status_code == 401
        headers = {"authorization": "Bearer s3cret"}
        assert (await http.post("/v1/tts", json=body, headers=headers)).status_code == 200


# ---- GET /v1/tts/live -----------------------------------------------------------------------


async def live(app: RunningApp) -> ClientConnection:
    return await connect(app.ws_url + "/v1/tts/live", max_size=None)


async def send(ws: ClientConnection, **event: Any) -> None:
    await ws.send(packed(event))


async def receive(ws: ClientConnection) -> dict[str, Any]:
    frame = await asyncio.wait_for(ws.recv(), WAIT_S)
    assert isinstance(frame, bytes)  # every server frame is binary msgpack
    event: dict[str, Any] = msgpack.unpackb(frame, raw=False)
    return event


async def until_finish(ws: ClientConnection) -> tuple[bytes, dict[str, Any]]:
    audio = bytearray()
    while (event := await receive(ws))["event"] != "finish":
        assert event["event"] == "audio" and isinstance(event["audio"], bytes)
        audio.extend(event["audio"])
    return bytes(audio), event


async def close_code(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), WAIT_S)
    return closed.value.rcvd.code if closed.value.rcvd else None


async def test_live_speaks_flushed_text_before_stop_and_finishes() -> None:
    engine = FakeEngine(rate_hz=16_000)
    async with serve_app(engine) as app:
        ws = await live(app)
        await send(ws, event="start", request={"text": "", "format": "pcm", "sample_rate": None})
        await send(ws, event="text", text="Not a sentence yet")
        await send(ws, event="flush")
        first = await receive(ws)  # flushed: spoken before any stop
        assert first["event"] == "audio" and first["audio"]
        await send(ws, event="text", text=" and more.")
        await send(ws, event="stop")
        rest, finish = await until_finish(ws)
        assert finish == {"event": "finish", "reason": "stop"}
        total = (len(first["audio"]) + len(rest)) // 2
        assert total == len("Not a sentence yet" + "and more.") * engine.samples_per_char
        assert await close_code(ws) == 1000
        assert [s.segments for s in engine.streams] == [["Not a sentence yet", "and more."]]
        await until(lambda: app.state.lifecycle.open_sockets == 0)
        assert app.state.admission.active == 0


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        (["a text frame"], "binary_not_supported"),
        ([b"\xc1"], "invalid_message"),
        ([packed({"event": "text", "text": "before start"})], "unknown_context"),
        ([packed({"event": "dance"})], "unknown_type"),
        ([packed({"event": "start", "request": {"text": "", "top_p": 3}})], "invalid_field"),
        (
            [packed({"event": "start", "request": {"text": "", "reference_id": "x"}})],
            "unknown_voice",
        ),
        (
            [packed({"event": "start", "request": {"text": ""}})] * 2,
            "context_exists",
        ),
        (
            [packed({"event": "start", "request": {"text": "", "prosody": {"speed": 2.0}}})],
            "invalid_field",
        ),  # a fish-kind engine refuses speed when the stream opens
    ],
)
async def test_live_bad_frames_finish_with_an_error(frames: list[Any], code: str) -> None:
    engine = FakeEngine(kind=FISH)
    async with serve_app(engine) as app:
        ws = await live(app)
        for frame in frames:
            await ws.send(frame)
        _, finish = await until_finish(ws)
        assert finish["reason"] == "error" and finish["code"] == code and finish["message"]
        assert await close_code(ws) == 1000
        await until(lambda: app.state.admission.active == 0 and not engine.open_streams)


async def test_live_disconnect_mid_stream_frees_the_slot() -> None:
    engine = FakeEngine(chunk_delay_s=0.02)
    async with serve_app(engine) as app:
        ws = await live(app)
        await send(ws, event="start", request={"text": "A long sentence, " * 20, "format": "mp3"})
        await send(ws, event="flush")
        assert (await receive(ws))["event"] == "audio"
        await ws.close()
        await until(lambda: not engine.open_streams and app.state.admission.active == 0)
        await until(lambda: app.state.lifecycle.open_sockets == 0)


async def test_live_shutdown_after_the_grace_ends_the_request_with_1001() -> None:
    engine = FakeEngine(chunk_delay_s=0.01)
    async with serve_app(engine) as app:
        ws = await live(app)
        await send(ws, event="start", request={"text": "", "format": "pcm"})
        await send(ws, event="text", text="Speaking, and never stopped.")
        await send(ws, event="flush")
        await receive(ws)
        await app.state.lifecycle.begin_drain(0.0)
        _, finish = await until_finish(ws)
        assert finish["reason"] == "error" and finish["code"] == "shutting_down"
        assert await close_code(ws) == 1001
        refused = await live(app)
        assert await close_code(refused) == 1001
