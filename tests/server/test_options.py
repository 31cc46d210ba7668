"""The option table on the wire: every interface validates against it, refuses at start what the
engine cannot honour (naming the option), accepts defaults, and says what each model takes.
In-process servers with a fake engine playing each engine kind."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from streamtts.options import FISH, PIPER, SynthesisOptions
from streamtts.server.metrics import parse_exposition
from tests.app_server import serve_app
from tests.fake_engine import FakeEngine
from tests.ws_client import StreamClient


async def start(client: StreamClient, context: str, options: dict[str, Any]) -> dict[str, Any]:
    await client.send(type="start", context=context, options=options)
    return await client.until(lambda m: m.get("context") == context, timeout_s=10)


@pytest.mark.parametrize(
    ("kind", "options", "refused"),
    [
        (PIPER, {"seed": 3}, "seed"),
        (PIPER, {"temperature": 0.9}, "temperature"),
        (PIPER, {"first_chunk_frames": 2}, "first_chunk_frames"),
        (FISH, {"speed": 2.0}, "speed"),
    ],
)
async def test_an_option_the_engine_cannot_honour_is_refused_at_start(
    kind: str, options: dict[str, Any], refused: str
) -> None:
    engine = FakeEngine(kind)
    async with serve_app(engine) as app:
        client = await StreamClient.open(app.ws_url)
        reply = await start(client, "c", options)
        assert reply["type"] == "error" and reply["code"] == "invalid_field"
        assert f"'{refused}'" in reply["message"] and kind in reply["message"]
        assert engine.opened == []  # nothing was opened
        # The socket and the context id stay usable.
        result = await client.speak("c", "Fine now.")
        assert result.done is not None and result.done["reason"] == "end"
        await client.close()


@pytest.mark.parametrize(
    ("kind", "options", "opened"),
    [
        # Values equal to their defaults ask for nothing: every engine accepts them.
        (PIPER, {"temperature": 0.7, "top_p": 0.7, "repetition_penalty": 1.2}, SynthesisOptions()),
        (FISH, {"speed": 1.0}, SynthesisOptions()),
        (PIPER, {"speed": 1.5}, SynthesisOptions(speed=1.5)),
        (FISH, {"seed": 9, "temperature": 0.9}, SynthesisOptions(seed=9, temperature=0.9)),
    ],
)
async def test_honoured_and_default_options_open_the_context(
    kind: str, options: dict[str, Any], opened: SynthesisOptions
) -> None:
    engine = FakeEngine(kind)
    async with serve_app(engine) as app:
        client = await StreamClient.open(app.ws_url)
        assert (await start(client, "c", options))["type"] == "started"
        assert engine.opened == [opened]
        await client.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speed": 9}, "0.25 ≤ speed ≤ 4"),
        ({"top_p": 0.0}, "0 < top_p ≤ 1"),
        ({"temperature": 2.0}, "0 < temperature < 2"),
        ({"repetition_penalty": 2.0}, "0 < repetition_penalty < 2"),
        ({"seed": 1.5}, "must be an integer"),
        ({"warp": 1}, "unknown option 'warp'"),
    ],
)
async def test_out_of_range_options_fail_at_start_not_later(
    options: dict[str, Any], message: str
) -> None:
    """The ranges are the table's: what the engine would reject is refused by the protocol."""
    async with serve_app(FakeEngine(FISH)) as app:
        client = await StreamClient.open(app.ws_url)
        reply = await start(client, "c", options)
        assert reply["type"] == "error" and reply["code"] == "invalid_field"
        assert message in reply["message"]
        await client.close()


async def test_openai_route_refuses_what_the_engine_cannot_honour() -> None:
    async with serve_app(FakeEngine(FISH)) as app, httpx.AsyncClient(base_url=app.url) as http:

        async def speech(**body: Any) -> httpx.Response:
            return await http.post("/v1/audio/speech", json={"input": "Hi there.", **body})

        refused = await speech(speed=2.0)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "speed" and error["code"] == "invalid_field"
        assert "'speed' is not supported by the fish engine" in error["message"]
        ok = await speech(speed=1.0, model="tts-1", response_format="pcm", stream_format="audio")
        assert ok.status_code == 200 and len(ok.content) > 0
        instructed = await speech(instructions="speak like a pirate")
        assert instructed.status_code == 400
        assert instructed.json()["error"]["param"] == "instructions"
        assert (await speech(instructions="")).status_code == 200
        unknown = await speech(volume_multiplier=2)
        assert unknown.status_code == 400
        assert unknown.json()["error"]["code"] == "unknown_parameter"
        assert (await speech(speed=0.1)).json()["error"]["param"] == "speed"


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        (PIPER, ["speed"]),
        (
            FISH,
            [
                "temperature",
                "top_p",
                "repetition_penalty",
                "seed",
                "first_chunk_frames",
                "chunk_frames",
                "max_frames_per_segment",
            ],
        ),
    ],
)
async def test_models_say_which_options_each_takes(kind: str, names: list[str]) -> None:
    async with serve_app(FakeEngine(kind)) as app, httpx.AsyncClient() as http:
        models = (await http.get(app.url + "/v1/models")).json()["data"]
    served = models[0]
    assert served["id"] == "fake" and served["engine"]["engine"] == kind
    assert [o["name"] for o in served["options"]] == names
    assert all(o["range"] and o["description"] for o in served["options"])


async def test_capacity_gauges_come_from_the_engine_contract() -> None:
    engine = FakeEngine(slots=3)
    async with serve_app(engine) as app, httpx.AsyncClient() as http:
        client = await StreamClient.open(app.ws_url)
        assert (await start(client, "c", {}))["type"] == "started"
        figures = parse_exposition((await http.get(app.url + "/metrics")).text)
        assert figures["streamtts_engine_capacity"] == 3
        assert figures["streamtts_engine_free_slots"] == 2
        await client.close()
    # No slots: no gauges, rather than a made-up 0.
    async with serve_app(FakeEngine()) as app, httpx.AsyncClient() as http:
        figures = parse_exposition((await http.get(app.url + "/metrics")).text)
        assert "streamtts_engine_capacity" not in figures
