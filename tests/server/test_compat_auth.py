"""The compatibility sockets take the same API keys as the native routes, each from where its
clients send it, and refuse a missing or wrong key the vendor's way."""

from __future__ import annotations

import pytest
from websockets.exceptions import InvalidStatus

from streamtts.config import Settings
from tests.app_server import RunningApp, serve_app
from tests.fake_engine import FakeEngine
from tests.json_socket import JsonSocket

KEY = "sk-test-compat"
SETTINGS = Settings().replace(api_keys=f"other-key,{KEY}")
MULTI = "/v1/text-to-speech/default/multi-stream-input?output_format=pcm_16000"
SINGLE = "/v1/text-to-speech/default/stream-input?output_format=pcm_16000"


async def elevenlabs_works(app: RunningApp, path: str, headers: dict[str, str]) -> None:
    ws = await JsonSocket.open(app.ws_url + path, headers)
    if "multi" in path:
        await ws.send(context_id="k", close_context=True)
        assert await ws.recv() == {"isFinal": True, "contextId": "k"}
    else:
        await ws.send(text=" ")
        await ws.send(text="")
        assert (await ws.until_closed())[-1] == {"isFinal": True}
    await ws.close()


async def cartesia_works(app: RunningApp, path: str, headers: dict[str, str]) -> None:
    ws = await JsonSocket.open(app.ws_url + path, headers)
    fmt = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}
    request = {"context_id": "k", "voice": "default", "output_format": fmt}
    await ws.send(**request, transcript="Hi.", **{"continue": True})
    await ws.send(**request, transcript="", **{"continue": False})
    messages = await ws.until(lambda m: m["type"] in ("done", "error"))
    assert messages[-1] == {"type": "done", "context_id": "k", "done": True, "status_code": 206}
    await ws.close()


@pytest.mark.parametrize(
    "headers",
    [
        {"xi-api-key": KEY},  # the ElevenLabs SDK, Pipecat, LiveKit
        {"Authorization": f"Bearer {KEY}"},
    ],
)
async def test_elevenlabs_sockets_take_the_key(headers: dict[str, str]) -> None:
    async with serve_app(FakeEngine(), SETTINGS) as app:
        await elevenlabs_works(app, MULTI, headers)
        await elevenlabs_works(app, SINGLE, headers)


@pytest.mark.parametrize("headers", [{}, {"xi-api-key": "wrong"}])
async def test_elevenlabs_refuses_a_missing_or_wrong_key_then_closes_with_1008(
    headers: dict[str, str],
) -> None:
    async with serve_app(FakeEngine(), SETTINGS) as app:
        for path in (MULTI, SINGLE):
            ws = await JsonSocket.open(app.ws_url + path, headers)
            [message] = await ws.until_closed()
            assert message["error"] == "unauthorized" and message["code"] == 1008
            assert ws.close_code == 1008


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/tts/websocket", {"Authorization": f"Bearer {KEY}"}),  # the Cartesia SDK
        ("/tts/websocket", {"X-API-Key": KEY, "Cartesia-Version": "2026-03-01"}),  # Pipecat
        (f"/tts/websocket?api_key={KEY}&cartesia_version=2025-04-16", {}),  # browsers
    ],
)
async def test_cartesia_takes_the_key(path: str, headers: dict[str, str]) -> None:
    async with serve_app(FakeEngine(), SETTINGS) as app:
        await cartesia_works(app, path, headers)


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer x"}])
async def test_cartesia_refuses_a_missing_or_wrong_key_with_401(headers: dict[str, str]) -> None:
    async with serve_app(FakeEngine(), SETTINGS) as app:
        with pytest.raises(InvalidStatus) as refused:
            await JsonSocket.open(app.ws_url + "/tts/websocket", headers)
    assert refused.value.response.status_code == 401
    assert b"unauthorized" in refused.value.response.body


async def test_the_native_socket_takes_the_same_keys_from_every_header() -> None:
    async with serve_app(FakeEngine(), SETTINGS) as app:
        ws = await JsonSocket.open(app.ws_url + "/v1/stream", {"X-API-Key": KEY})
        await ws.send(type="flush", context="nope")
        assert (await ws.recv())["code"] == "unknown_context"
        await ws.close()
