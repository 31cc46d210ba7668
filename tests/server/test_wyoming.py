"""The Wyoming server (Home Assistant) end to end: the real app on a real uvicorn with its
Wyoming listener on 127.0.0.1, driven by the ``wyoming`` package's ``AsyncTcpClient`` in Home
Assistant's own sequence (``loadtest.home_assistant``), on the bundled voice and on a fake
engine; bad events, disconnects, overload and slow readers; SIGTERM drains it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from loadtest import home_assistant as ha
from streamtts.config import Settings
from streamtts.engine.base import Engine
from streamtts.engine.factory import create_engine
from streamtts.server.metrics import parse_exposition
from streamtts.wyoming.framing import encode_event
from tests.app_server import RunningApp, serve_app, until
from tests.fake_engine import FakeEngine
from tests.server.test_shutdown import wait_exit
from tests.servers import ServerProcess, free_port

HOST = "127.0.0.1"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Then it runs home across the fields, tired and happy.",
]
# An LLM's deltas: the first sentence is complete once the next one begins.
LLM_DELTAS = [
    "The quick", " brown fox", " jumps over", " the lazy", " dog near", " the river", " bank.",
    " Then it runs",
]  # fmt: skip
LATER_DELTAS = [" home across", " the fields,", " tired and happy."]
WAIT_S = 30.0


@asynccontextmanager
async def wyoming_app(engine: Engine, **settings: object) -> AsyncIterator[tuple[RunningApp, int]]:
    port = free_port()
    async with serve_app(engine, Settings().replace(wyoming_port=port, **settings)) as app:
        yield app, port


async def llm_text(result: ha.TtsResult) -> AsyncIterator[str]:
    """An LLM's deltas: the first sentence, then — once its audio has started (or after a long
    wait, and the test fails) — the rest."""
    for delta in LLM_DELTAS:
        await asyncio.sleep(0.01)
        yield delta
    with contextlib.suppress(TimeoutError):
        await until(lambda: result.first_audio_s is not None, WAIT_S)
    for delta in LATER_DELTAS:
        yield delta


async def stream_llm_text(port: int, voice: str | None = None) -> ha.TtsResult:
    result = ha.TtsResult(0.0)
    return await ha.stream(HOST, port, llm_text(result), voice, result)


def pcm_rms(result: ha.TtsResult) -> float:
    samples = np.frombuffer(bytes(result.pcm), "<i2").astype(np.float32) / 32767
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


async def raw_connection(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(HOST, port)


async def read_all_events(reader: asyncio.StreamReader) -> list[Event]:
    """Every event until the server closes the connection (wyoming's own reader)."""
    from wyoming.event import async_read_event

    events = []
    while (event := await asyncio.wait_for(async_read_event(reader), WAIT_S)) is not None:
        events.append(event)
    return events


# ---- Home Assistant's sequence on the bundled voice ----------------------------------------


async def test_home_assistant_describe_plain_and_streaming_on_the_bundled_voice() -> None:
    engine = create_engine(Settings())
    async with wyoming_app(engine) as (app, port):
        info = await ha.describe(HOST, port)
        assert info is not None
        program = next(p for p in info.tts if p.installed)  # as Home Assistant picks it
        assert program.supports_synthesize_streaming
        voices = [v for v in program.voices if v.installed]
        assert [v.name for v in voices] == [v.id for v in engine.voices()]
        assert voices[0].languages == ["en-US"]

        plain = await ha.synthesize(HOST, port, " ".join(SENTENCES), voice=voices[0].name)
        assert plain.ended_by == "audio-stop" and not plain.errors
        assert plain.formats == {(engine.sample_rate, 2, 1)}  # one format for the response
        assert 4.0 < plain.duration_s < 12.0, plain.duration_s
        assert pcm_rms(plain) > 0.02

        streamed = await stream_llm_text(port, voices[0].name)
        assert streamed.ended_by == "synthesize-stopped" and not streamed.errors
        assert (streamed.rate, streamed.width, streamed.channels) == (engine.sample_rate, 2, 1)
        assert streamed.formats == {(engine.sample_rate, 2, 1)}
        # Audio started while the text was still being written, before synthesize-stop.
        assert streamed.first_audio_s is not None and streamed.stop_sent_s is not None
        assert streamed.first_audio_s < streamed.stop_sent_s
        # The whole text once: the compatibility `synthesize` was not spoken again.
        assert 0.75 < streamed.duration_s / plain.duration_s < 1.3
        print(f"\nWyoming streaming first audio: {streamed.first_audio_ms:.0f} ms")
        assert app.state.admission.active == 0


# ---- the fake engine: what exactly is spoken, and every way to misbehave -------------------


async def test_the_compatibility_synthesize_is_not_spoken_twice() -> None:
    engine = FakeEngine(chunk_delay_s=0.001)
    async with wyoming_app(engine) as (_, port):
        streamed = await stream_llm_text(port)
        assert streamed.ended_by == "synthesize-stopped"
        (stream,) = engine.streams
        assert " ".join(stream.segments) == " ".join(SENTENCES)
        assert streamed.first_audio_s is not None and streamed.stop_sent_s is not None
        assert streamed.first_audio_s < streamed.stop_sent_s


async def test_metrics_and_admission_count_wyoming_requests() -> None:
    engine = FakeEngine()
    async with wyoming_app(engine) as (app, port):
        for _ in range(2):
            assert (await ha.synthesize(HOST, port, "Hello there.")).ended_by == "audio-stop"
        metrics = parse_exposition(app.state.metrics.render().decode())
        assert metrics['streamtts_contexts_total{reason="end"}'] == 2
        assert metrics["streamtts_ttfa_ms_count"] == 2
        await until(lambda: app.state.lifecycle.open_sockets == 0)
        assert app.state.admission.active == 0


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"this is not json\n", "invalid_json"),
        (b'{"type": "synthesize", "data_length": 99999999}\n', "message_too_big"),
        (b'{"type": "synthesize", "payload_length": -4}\n', "invalid_field"),
        (b'{"type": 12}\n', "invalid_field"),
        (b'{"type": "synthesize", "data": {"text": 12}}\n', "invalid_field"),
        (b'{"type": "synthesize", "data_length": 3}\nabc', "invalid_json"),
        (b"x" * 70_000, "message_too_big"),  # a header line with no end
    ],
)
async def test_bad_events_are_answered_then_the_connection_closes(raw: bytes, code: str) -> None:
    engine = FakeEngine()
    async with wyoming_app(engine) as (app, port):
        reader, writer = await raw_connection(port)
        writer.write(raw)
        await writer.drain()
        events = await read_all_events(reader)  # returns: the server closed the connection
        assert [e.type for e in events] == ["error"]
        assert Error.from_event(events[0]).code == code
        writer.close()
        # The server is fine for everyone else.
        assert (await ha.synthesize(HOST, port, "Still here.")).ended_by == "audio-stop"
        assert engine.streams and len(engine.streams) == 1
        await until(lambda: app.state.lifecycle.open_sockets == 0)


async def test_unknown_events_and_payloads_are_dropped_and_the_connection_goes_on() -> None:
    async with wyoming_app(FakeEngine()) as (_, port), AsyncTcpClient(HOST, port) as client:
        await client.write_event(Event("transcribe", {"language": "en"}))
        await client.write_event(Event("audio-chunk", {"rate": 16000}, payload=b"\x00" * 5000))
        await client.write_event(Describe().event())
        event = await asyncio.wait_for(client.read_event(), WAIT_S)
        assert event is not None and Info.is_type(event.type)


async def test_a_peer_that_disconnects_mid_response_leaks_nothing() -> None:
    engine = FakeEngine(chunk_delay_s=0.02)
    async with wyoming_app(engine) as (app, port):
        other = asyncio.create_task(ha.synthesize(HOST, port, "The other client is unharmed."))
        reader, writer = await raw_connection(port)
        text = "A long answer that will not be heard. " * 20
        writer.write(_encode(Synthesize(text=text).event()))
        await writer.drain()
        await asyncio.wait_for(reader.readuntil(b'"audio-chunk"'), WAIT_S)
        writer.transport.abort()  # gone, with a reset
        await until(lambda: not engine.open_streams and app.state.admission.active == 0)
        assert engine.streams[-1].closed or engine.streams[0].closed
        assert (await other).ended_by == "audio-stop"
        metrics = parse_exposition(app.state.metrics.render().decode())
        assert metrics['streamtts_contexts_total{reason="disconnect"}'] == 1
        await until(lambda: app.state.lifecycle.open_sockets == 0)


async def test_a_client_that_half_closes_after_its_request_still_gets_the_answer() -> None:
    async with wyoming_app(FakeEngine(chunk_delay_s=0.005)) as (_, port):
        reader, writer = await raw_connection(port)
        writer.write(_encode(Synthesize(text="Hello there. How are you?").event()))
        writer.write_eof()
        events = await read_all_events(reader)
        kinds = [e.type for e in events]
        assert kinds[0] == "audio-start" and kinds[-1] == "audio-stop"
        assert set(kinds[1:-1]) == {"audio-chunk"}


async def test_overload_is_an_error_for_that_request_only() -> None:
    engine = FakeEngine(chunk_delay_s=0.01)
    app_server = wyoming_app(engine, max_active_contexts=1)
    async with app_server as (app, port), AsyncTcpClient(HOST, port) as holder:
        await holder.write_event(SynthesizeStart().event())
        await holder.write_event(SynthesizeChunk(text="I hold the only ticket.").event())
        await until(lambda: app.state.admission.active == 1)
        refused = await ha.synthesize(HOST, port, "No room for me.")
        assert refused.ended_by == "disconnect" and refused.chunks == 0
        assert [e.code for e in refused.errors] == ["overloaded"]
        await holder.write_event(SynthesizeStop().event())
        kinds = []
        while (event := await asyncio.wait_for(holder.read_event(), WAIT_S)) is not None:
            kinds.append(event.type)
            if event.type == "synthesize-stopped":
                break
        assert kinds[0] == "audio-start" and kinds[-2:] == ["audio-stop", "synthesize-stopped"]


async def test_a_client_that_does_not_read_is_cut_off() -> None:
    engine = FakeEngine(samples_per_char=1600)
    async with wyoming_app(engine, max_output_buffer_ms=200.0) as (app, port):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((HOST, port))
        reader, writer = await asyncio.open_connection(sock=sock)
        text = "Words that nobody will ever read. " * 60  # about 2 MB of audio
        writer.write(_encode(Synthesize(text=text).event()))
        await writer.drain()
        await until(lambda: bool(engine.streams))
        await until(lambda: app.state.admission.active == 0 and not engine.open_streams)
        assert engine.streams[0].segments[-1] != text.split(". ")[-1]  # it did not finish
        metrics = parse_exposition(app.state.metrics.render().decode())
        assert metrics['streamtts_errors_total{code="slow_consumer"}'] == 1
        writer.close()
        assert (await ha.synthesize(HOST, port, "Others go on.")).ended_by == "audio-stop"


async def test_zeroconf_advertises_the_server_when_asked() -> None:
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    from streamtts.server.discovery import SERVICE_TYPE

    name = f"streamtts-test-{free_port()}"
    engine = FakeEngine()
    async with wyoming_app(engine, wyoming_zeroconf=True, wyoming_zeroconf_name=name) as (_, port):
        browser = AsyncZeroconf(interfaces=["127.0.0.1"])
        try:
            info = AsyncServiceInfo(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}")
            assert await info.async_request(browser.zeroconf, 5000)
            assert info.port == port and info.parsed_addresses() == ["127.0.0.1"]
        finally:
            await browser.async_close()


# ---- settings, start and shutdown ---------------------------------------------------------


class SlowStartEngine(FakeEngine):
    """Loads until the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.may_start = asyncio.Event()

    async def start(self) -> None:
        await self.may_start.wait()
        await super().start()


async def test_wyoming_listens_only_once_the_engine_is_ready() -> None:
    import uvicorn

    from streamtts.server.app import create_app

    engine = SlowStartEngine()
    wyoming_port = free_port()
    settings = Settings().replace(port=free_port(), wyoming_port=wyoming_port)
    config = uvicorn.Config(create_app(settings, engine), host=HOST, port=settings.port)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await asyncio.sleep(0.5)  # the app is starting: loading its model
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(HOST, wyoming_port)
        engine.may_start.set()
        await until(lambda: server.started)
        info = await ha.describe(HOST, wyoming_port)
        assert info is not None and info.tts[0].installed
    finally:
        engine.may_start.set()
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_S)


# ---- settings and shutdown -------------------------------------------------------------------


def test_wyoming_is_off_by_default_and_its_settings_are_checked() -> None:
    from streamtts.config import SettingsError

    settings = Settings.from_env({"STREAMTTS_WYOMING_PORT": "10200", "STREAMTTS_HOST": "0.0.0.0"})
    assert not Settings().wyoming.enabled
    assert settings.wyoming.enabled and settings.wyoming_host == "0.0.0.0"
    assert Settings.from_env({"STREAMTTS_WYOMING_HOST": "127.0.0.2"}).wyoming_host == "127.0.0.2"
    with pytest.raises(SettingsError, match="wyoming_port"):
        Settings.from_env({"STREAMTTS_WYOMING_PORT": "70000"})
    with pytest.raises(SettingsError, match="HTTP port"):
        Settings().replace(wyoming_port=8000)


async def test_a_non_loopback_bind_logs_a_security_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    with caplog.at_level("WARNING", logger="streamtts.server.wyoming"):
        async with serve_app(
            FakeEngine(), Settings().replace(wyoming_port=port, wyoming_host="0.0.0.0")
        ):
            pass
    assert any("no authentication" in r.getMessage() for r in caplog.records)


async def test_sigterm_finishes_wyoming_responses_in_flight_and_refuses_new_ones() -> None:
    grace_s = 4.0
    wyoming_port = free_port()
    server = ServerProcess(
        "--wyoming-port", str(wyoming_port), env={"STREAMTTS_SHUTDOWN_GRACE_S": str(grace_s)}
    )
    try:
        server.wait_ready()
        # "finishing": streaming, ends during the grace; "lingering": never ends by itself.
        finishing = AsyncTcpClient(HOST, wyoming_port)
        lingering = AsyncTcpClient(HOST, wyoming_port)
        for client in (finishing, lingering):
            await client.connect()
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text=SENTENCES[0] + " And").event())
            event = await asyncio.wait_for(client.read_event(), WAIT_S)
            assert event is not None and event.type == "audio-start"

        signalled_s = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        late = await ha.synthesize(HOST, wyoming_port, "Too late.")
        assert [e.code for e in late.errors] == ["shutting_down"] and late.chunks == 0

        await finishing.write_event(SynthesizeChunk(text=" that is all.").event())
        await finishing.write_event(SynthesizeStop().event())
        kinds = []
        while (event := await asyncio.wait_for(finishing.read_event(), WAIT_S)) is not None:
            kinds.append(event.type)
            if event.type == "synthesize-stopped":
                break
        assert kinds[-2:] == ["audio-stop", "synthesize-stopped"] and "error" not in kinds
        assert time.monotonic() - signalled_s < grace_s
        await finishing.disconnect()

        events = []
        while (event := await asyncio.wait_for(lingering.read_event(), grace_s + 10)) is not None:
            events.append(event)
        ended_s = time.monotonic() - signalled_s
        assert [Error.from_event(e).code for e in events if e.type == "error"] == ["shutting_down"]
        assert grace_s - 0.5 < ended_s < grace_s + 3, ended_s

        assert await wait_exit(server, 15) == 0
        await lingering.disconnect()
    finally:
        server.stop()


def _encode(event: Event) -> bytes:
    return encode_event(event)
