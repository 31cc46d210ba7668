"""The real clients, unmodified, against the server: the ElevenLabs SDK over wss://, Pipecat's
ElevenLabs and Cartesia services (turns and a barge-in), LiveKit's ElevenLabs plugin and the
Cartesia SDK (sync and async). Each runs in a subprocess from ``.venv-clients``
(``loadtest/compat``); the server runs in process with a fake engine, behind a wire recorder, so
the tests check what crossed the wire and what the engine was asked to generate, not only what
the client kept. Every client authenticates the way it does against the vendor.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import av
import pytest

from loadtest.compat import run_client
from loadtest.tls import Certificate, self_signed
from streamtts.config import Settings
from tests.app_server import serve_app
from tests.fake_engine import FakeEngine, FakeStream
from tests.json_socket import audio_of
from tests.wire import Connection, WireRecorder

KEY = "sk-real-clients"
SETTINGS = Settings().replace(api_keys=KEY)
RATE_HZ = 16_000
SAMPLES_PER_CHAR = 160  # 10 ms of audio a character
CHUNK_SAMPLES = 800  # 50 ms


def engine(real_time: bool = False) -> FakeEngine:
    """Instant, or at the pace of real time (so that a barge-in finds work to stop)."""
    return FakeEngine(
        rate_hz=RATE_HZ,
        samples_per_char=SAMPLES_PER_CHAR,
        chunk_samples=CHUNK_SAMPLES,
        chunk_delay_s=0.05 if real_time else 0.0,
    )


def spoken_bytes(stream: FakeStream, rate_hz: int, bytes_per_sample: int = 2) -> int:
    samples = sum(len(s) for s in stream.segments) * SAMPLES_PER_CHAR
    return samples * rate_hz // RATE_HZ * bytes_per_sample


def events_of(events: list[dict[str, Any]], kind: str, **match: Any) -> list[dict[str, Any]]:
    return [
        e for e in events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())
    ]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    return self_signed(tmp_path_factory.mktemp("tls"))


def frames_for(conn: Connection, context: str, key: str) -> list[tuple[float, dict[str, Any]]]:
    """The server's JSON frames for ``context`` (under ``key``), with their times."""
    return [
        (f.t, m)
        for f in conn.frames
        if not f.incoming and (m := f.json()) is not None and m.get(key) == context
    ]


def received_at(conn: Connection, message: dict[str, Any]) -> float:
    """When the server received ``message``."""
    return next(f.t for f in conn.frames if f.incoming and f.json() == message)


def stopped_at_once(stream: FakeStream) -> None:
    """The barge-in cancelled the engine stream, and no audio was generated after it."""
    assert stream.cancelled_at is not None
    assert not [t for t in stream.chunk_times if t > stream.cancelled_at]


# ---- ElevenLabs ----


@pytest.mark.parametrize("output_format", [None, "pcm_16000"])
async def test_elevenlabs_sdk_convert_realtime_over_wss(
    certificate: Certificate, tmp_path: Path, output_format: str | None
) -> None:
    settings = SETTINGS.replace(
        ssl_certfile=str(certificate.certfile), ssl_keyfile=str(certificate.keyfile)
    )
    fake, wire = engine(), WireRecorder()
    out = tmp_path / "audio"
    args = ["--api-key", KEY, "--out", str(out)]
    if output_format:
        args += ["--format", output_format]
    async with serve_app(fake, settings, wrap=wire.wrap) as app:
        assert app.url.startswith("https://")
        args += ["--base-url", app.url]
        events = await run_client(
            "elevenlabs_sdk", args, env={"SSL_CERT_FILE": str(certificate.certfile)}
        )
    # Streaming: audio came back while the text was still being sent.
    [text_end] = events_of(events, "text_end")
    audio = events_of(events, "audio")
    assert audio and audio[0]["t"] < text_end["t"]
    [conn] = wire.connections
    assert conn.path == "/v1/text-to-speech/default/stream-input"
    assert conn.headers["xi-api-key"] == KEY and conn.close_code == 1000
    assert conn.sent()[-1] == {"isFinal": True}
    [stream] = fake.streams
    data = out.read_bytes()
    if output_format == "pcm_16000":
        assert len(data) == spoken_bytes(stream, 16000)
    else:  # the SDK's default, mp3_44100_128: one mp3 stream
        container = av.open(io.BytesIO(data), format="mp3")
        decoded = sum(f.samples for f in container.decode(container.streams.audio[0]))
        expected = spoken_bytes(stream, 44100) // 2
        assert expected <= decoded <= expected + 3 * 1152


async def test_pipecat_elevenlabs_turns_and_a_barge_in() -> None:
    fake, wire = engine(real_time=True), WireRecorder()
    async with serve_app(fake, SETTINGS, wrap=wire.wrap) as app:
        events = await run_client(
            "pipecat_tts",
            ["--service", "elevenlabs", "--url", app.ws_url, "--api-key", KEY]
            + ["--turns", "3", "--interrupt", "1"],
        )
    # One socket for every turn.
    [conn] = wire.connections
    assert conn.path == "/v1/text-to-speech/default/multi-stream-input"
    assert "output_format=pcm_24000" in conn.query and conn.headers["xi-api-key"] == KEY
    contexts = list(dict.fromkeys(m["context_id"] for m in conn.received() if "context_id" in m))
    assert len(contexts) == 3 and len(fake.streams) == 3
    assert {e["sample_rate"] for e in events_of(events, "audio")} == {24000}
    for turn in (0, 2):  # whole turns: all their audio, then isFinal, then Pipecat's stop
        assert events_of(events, "stopped", turn=turn)
        sent = [m for _, m in frames_for(conn, contexts[turn], "contextId")]
        assert sent[-1] == {"isFinal": True, "contextId": contexts[turn]}
        stream = fake.streams[turn]
        expected = spoken_bytes(stream, 24000)  # ±1 sample a segment: the resampler's rounding
        assert len(audio_of(sent)) == pytest.approx(expected, abs=2 * len(stream.segments))
        assert fake.streams[turn].cancelled_at is None
    # The barge-in: close_context with no flush since the last text...
    interrupted = contexts[1]
    mine = [m for m in conn.received() if m.get("context_id") == interrupted]
    assert mine[-1] == {"context_id": interrupted, "close_context": True}
    assert not any(m.get("flush") for m in mine)
    # ...stopped generation at once, and nothing but its isFinal was sent after it.
    stopped_at_once(fake.streams[1])
    closed_at = received_at(conn, {"context_id": interrupted, "close_context": True})
    after = [m for t, m in frames_for(conn, interrupted, "contextId") if t >= closed_at]
    assert after == [{"isFinal": True, "contextId": interrupted}]
    assert len(fake.streams[1].chunk_times) < len(fake.streams[0].chunk_times)


async def test_livekit_elevenlabs_stream_all_audio_then_done() -> None:
    fake, wire = engine(), WireRecorder()
    async with serve_app(fake, SETTINGS, wrap=wire.wrap) as app:
        events = await run_client(
            "livekit_elevenlabs", ["--base-url", app.url + "/v1", "--api-key", KEY]
        )
    [conn] = wire.connections
    assert conn.headers["xi-api-key"] == KEY
    assert "inactivity_timeout=180" in conn.query and "sync_alignment=true" in conn.query
    audio = events_of(events, "audio")
    [done] = events_of(events, "done")
    assert audio and all(e["t"] <= done["t"] for e in audio)
    assert {e["sample_rate"] for e in audio} == {16000} and audio[-1]["final"]
    [stream] = fake.streams
    assert events[-1]["audio_bytes"] == spoken_bytes(stream, 16000)
    assert stream.segments[0].startswith("Sure, here is the plan")


# ---- Cartesia ----


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_cartesia_sdk_contexts_on_one_socket(certificate: Certificate, mode: str) -> None:
    # sync over a plain ws:// websocket_base_url; async from an https:// base_url (wss://).
    tls = mode == "async"
    settings = SETTINGS
    if tls:
        settings = settings.replace(
            ssl_certfile=str(certificate.certfile), ssl_keyfile=str(certificate.keyfile)
        )
    fake, wire = engine(real_time=True), WireRecorder()
    async with serve_app(fake, settings, wrap=wire.wrap) as app:
        where = ["--base-url", app.url] if tls else ["--websocket-base-url", app.ws_url]
        events = await run_client(
            "cartesia_sdk",
            ["--mode", mode, "--api-key", KEY, *where],
            env={"SSL_CERT_FILE": str(certificate.certfile)},
        )
    [conn] = wire.connections
    assert conn.path == "/tts/websocket" and conn.headers["authorization"] == f"Bearer {KEY}"
    first_chunks = events_of(events, "chunk", reader="first", context="first")
    [text_end] = events_of(events, "text_end")
    assert first_chunks[0]["t"] < text_end["t"]  # audio while the tokens were still coming
    assert events_of(events, "done", reader="first", context="first")
    assert sum(e["bytes"] for e in first_chunks) == spoken_bytes(fake.streams[0], 44100, 4)
    # The cancelled context: stopped at once; nothing for it on the wire after the cancel.
    stopped_at_once(fake.streams[1])
    cancelled_at = received_at(conn, {"cancel": True, "context_id": "second"})
    assert not [m for t, m in frames_for(conn, "second", "context_id") if t >= cancelled_at]
    # The third context was read whole: the SDK hands a cancelled context's late frames to the
    # reader of another, and a late done would have ended it early.
    third = [e for e in events if e.get("reader") == "third"]
    assert third[-1]["event"] == "done" and third[-1]["context"] == "third"
    assert not [e for e in third if e["context"] != "third" and e["event"] != "chunk"]
    own = sum(e["bytes"] for e in third if e["context"] == "third")
    assert own == spoken_bytes(fake.streams[2], 44100, 4)


async def test_pipecat_cartesia_turns_and_a_barge_in() -> None:
    fake, wire = engine(real_time=True), WireRecorder()
    async with serve_app(fake, SETTINGS, wrap=wire.wrap) as app:
        events = await run_client(
            "pipecat_tts",
            ["--service", "cartesia", "--url", app.ws_url + "/tts/websocket", "--api-key", KEY]
            + ["--turns", "3", "--interrupt", "1"],
        )
    [conn] = wire.connections
    assert conn.headers["x-api-key"] == KEY and conn.headers["cartesia-version"]
    contexts = list(dict.fromkeys(m["context_id"] for m in conn.received()))
    assert len(contexts) == 3
    for turn in (0, 2):
        assert events_of(events, "stopped", turn=turn)
        sent = [m for _, m in frames_for(conn, contexts[turn], "context_id")]
        assert sent[-1]["type"] == "done"
        stream = fake.streams[turn]
        expected = spoken_bytes(stream, 24000)
        assert len(audio_of(sent, "data")) == pytest.approx(expected, abs=2 * len(stream.segments))
    interrupted = contexts[1]
    assert {"context_id": interrupted, "cancel": True} in conn.received()
    stopped_at_once(fake.streams[1])
    cancelled_at = received_at(conn, {"context_id": interrupted, "cancel": True})
    assert not [m for t, m in frames_for(conn, interrupted, "context_id") if t >= cancelled_at]
    assert len(fake.streams[1].chunk_times) < len(fake.streams[0].chunk_times)
