"""Server-wide limits on a real server: admission control (WebSocket and HTTP), the engine's own
capacity (KV slots), and the per-context output buffer (a slow reader)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from streamtts.config import Settings, leaves
from streamtts.server.metrics import parse_exposition
from tests.app_server import serve_app
from tests.fake_engine import FakeEngine
from tests.servers import ServerProcess
from tests.ws_client import StreamClient

LONG_TEXT = " ".join(
    [
        "Once upon a time, in a small village by the sea, there lived an old fisherman.",
        "Every morning he rowed his little boat out past the rocks to cast his nets.",
        "The villagers said he knew the moods of the water better than anyone alive.",
        "One winter the storms came early and stayed for many long and bitter weeks.",
    ]
)
REFUSAL_BUDGET_S = 0.100


def metrics(url: str) -> dict[str, float]:
    return parse_exposition(httpx.get(url + "/metrics", timeout=5).text)


async def done_times(client: StreamClient, contexts: set[str]) -> dict[str, float]:
    """Read the socket until every context is done; when each ``done`` arrived."""
    done_at: dict[str, float] = {}
    while set(done_at) != contexts:
        message = await client.receive_one()
        if message is not None and message["type"] == "done":
            done_at[message["context"]] = time.perf_counter()
    return done_at


@pytest.fixture(scope="module")
def limited_server() -> Iterator[ServerProcess]:
    server = ServerProcess(env={"STREAMTTS_MAX_ACTIVE_CONTEXTS": "2"})
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


async def test_admission_refuses_at_once_while_admitted_streams_keep_real_time(
    limited_server: ServerProcess,
) -> None:
    server = limited_server
    prober = await StreamClient.open(server.ws_url)  # connected before the server is full
    speaker = await StreamClient.open(server.ws_url)
    sent_s: dict[str, float] = {}
    for context in ("a1", "a2"):
        await speaker.send(type="start", context=context)
        sent_s[context] = time.perf_counter()
        await speaker.send(type="text", context=context, text=LONG_TEXT)
        await speaker.send(type="end", context=context)
    speaking = asyncio.create_task(done_times(speaker, {"a1", "a2"}))

    refusals_s: list[float] = []
    for i in range(20):
        context = f"r{i}"
        began = time.perf_counter()
        await prober.send(type="start", context=context)
        answer = await prober.until(lambda m, c=context: m.get("context") == c, timeout_s=5)
        refusals_s.append(time.perf_counter() - began)
        assert answer["type"] == "error" and answer["code"] == "overloaded", answer
        await asyncio.sleep(0.02)

    # A new connection while full: accepted, then closed with 1013 at once.
    began = time.perf_counter()
    ws = await connect(server.ws_url + "/v1/stream")
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()
    connection_refusal_s = time.perf_counter() - began
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013

    # HTTP: 429 with Retry-After, at once.
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
        began = time.perf_counter()
        response = await http.post(
            "/v1/audio/speech", json={"input": "Hello.", "response_format": "pcm"}
        )
        http_refusal_s = time.perf_counter() - began
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "overloaded"

    done_at = await speaking
    margins = []
    for context in ("a1", "a2"):
        result = speaker.contexts[context]
        assert result.done is not None and result.done["reason"] == "end"
        audio_s = len(result.audio) / 2 / 24000
        assert audio_s == pytest.approx(result.done["stats"]["audio_ms"] / 1000, abs=0.01)
        margins.append(audio_s / (done_at[context] - sent_s[context]))
    worst_refusal_s = max(refusals_s)
    print(
        f"\nrefusal latency: start max {1000 * worst_refusal_s:.1f} ms "
        f"(median {1000 * sorted(refusals_s)[len(refusals_s) // 2]:.1f} ms), "
        f"new socket {1000 * connection_refusal_s:.1f} ms, HTTP {1000 * http_refusal_s:.1f} ms; "
        f"admitted streams' audio s per wall s: {', '.join(f'{m:.2f}' for m in margins)}"
    )
    assert worst_refusal_s < REFUSAL_BUDGET_S
    assert connection_refusal_s < REFUSAL_BUDGET_S
    assert http_refusal_s < REFUSAL_BUDGET_S
    assert min(margins) > 1.0

    # Capacity is back: the refused client can speak now.
    after = await prober.speak("after", "Now there is room.")
    assert after.done is not None and after.done["reason"] == "end"
    figures = metrics(server.url)
    assert figures["streamtts_active_contexts"] == 0
    assert figures['streamtts_errors_total{code="overloaded"}'] >= 21
    await prober.close()
    await speaker.close()


async def test_engine_without_a_free_slot_is_the_same_outcome() -> None:
    server = ServerProcess(
        "--model",
        "synthetic:tiny",
        env={"STREAMTTS_DTYPE": "fp32", "STREAMTTS_MAX_STREAMS": "2"},
    )
    try:
        server.wait_ready()
        client = await StreamClient.open(server.ws_url)
        for context in ("s1", "s2"):
            await client.send(type="start", context=context)
            await client.until(lambda m, c=context: m["type"] == "started" and m["context"] == c)
        figures = metrics(server.url)
        assert figures["streamtts_engine_capacity"] == 2
        assert figures["streamtts_engine_free_slots"] == 0
        began = time.perf_counter()
        await client.send(type="start", context="s3")
        answer = await client.until(lambda m: m.get("context") == "s3", timeout_s=5)
        assert time.perf_counter() - began < REFUSAL_BUDGET_S
        assert answer["type"] == "error" and answer["code"] == "overloaded"
        response = httpx.post(
            server.url + "/v1/audio/speech",
            json={"input": "Hello.", "response_format": "pcm"},
            timeout=10,
        )
        assert response.status_code == 429 and "retry-after" in response.headers
        # A cancel frees the slot for the next one.
        await client.send(type="cancel", context="s1")
        await client.until_done("s1")
        result = await client.speak("s4", "Three short words.")
        assert result.done is not None and result.done["reason"] == "end"
        await client.send(type="cancel", context="s2")
        await client.until_done("s2")
        await client.close()
        await asyncio.sleep(0.3)
        figures = metrics(server.url)
        assert figures["streamtts_engine_free_slots"] == 2
        assert figures["streamtts_active_contexts"] == 0
    finally:
        server.stop()


async def open_non_reading_client(port: int, ws_url: str) -> StreamClient:
    """A client whose socket buffers almost nothing and that does not read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    ws = await connect(ws_url + "/v1/stream", sock=sock, max_queue=1, max_size=None)
    return StreamClient(ws)


async def test_a_slow_reader_loses_only_its_own_context() -> None:
    """In process (the server's buffering is what is tested, not a model): a fake engine that
    makes 25 ms of audio per character."""
    engine = FakeEngine(samples_per_char=400)
    settings = Settings().replace(max_output_buffer_ms=2000)
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:

        async def figures() -> dict[str, float]:
            return parse_exposition((await http.get("/metrics")).text)

        port = int(app.url.rsplit(":", 1)[1])
        slow = await open_non_reading_client(port, app.ws_url)
        fmt = {"encoding": "pcm_f32le", "sample_rate": 48000}  # 192 kB per second of audio
        await slow.send(type="start", context="slow", format=fmt)
        for _ in range(3):
            await slow.send(type="text", context="slow", text=LONG_TEXT + " ")
        await slow.send(type="end", context="slow")

        # Wait until the server gave up on it (the slow client still reads nothing).
        deadline = time.monotonic() + 60
        while (await figures()).get('streamtts_errors_total{code="slow_consumer"}', 0) < 1:
            assert time.monotonic() < deadline, "no slow_consumer within 60 s"
            await asyncio.sleep(0.2)
        after = await figures()
        assert after["streamtts_active_contexts"] == 0  # its admission ticket is back
        assert after["streamtts_output_buffer_bytes"] == 0  # its queued audio is gone
        assert not engine.open_streams  # its engine stream was closed

        # Another client, meanwhile, is served normally.
        other = await StreamClient.open(app.ws_url)
        result = await other.speak("fine", "Other clients are not affected.")
        assert result.done is not None and result.done["reason"] == "end"
        assert len(result.audio) > 24_000
        await other.close()

        # When the slow client finally reads: its error, then done with reason error.
        result_slow = await slow.until_done("slow", timeout_s=30)
        errors = result_slow.of_type("error")
        assert [e["code"] for e in errors] == ["slow_consumer"]
        assert result_slow.done is not None and result_slow.done["reason"] == "error"
        assert result_slow.messages.index(errors[0]) < result_slow.messages.index(result_slow.done)
        await slow.close()


def test_every_setting_is_documented() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for name, _ in leaves(Settings()):
        assert f"`STREAMTTS_{name.upper()}`" in doc, name


async def test_admission_by_capacity_refuses_at_once_while_the_admitted_streams_go_on() -> None:
    """An engine that measured it keeps 2 streams at real time: a third is refused (context,
    socket, HTTP) within a moment, while the two admitted streams are served to their end; the
    server stays ready; once they end, a stream is admitted again."""
    engine = FakeEngine(realtime_streams=2.0, chunk_delay_s=0.02)
    async with serve_app(engine, admit_by_capacity=True) as app, httpx.AsyncClient() as http:
        speaker, other = await StreamClient.open(app.ws_url), await StreamClient.open(app.ws_url)
        for context in ("a1", "a2"):
            await speaker.send(type="start", context=context)
            await speaker.send(type="text", context=context, text=LONG_TEXT)
            await speaker.send(type="end", context=context)
        for context in ("a1", "a2"):
            await speaker.until(lambda m, c=context: m["type"] == "started" and m["context"] == c)

        sent_s = time.perf_counter()
        await other.send(type="start", context="b1")
        refused = await other.until(lambda m: m.get("context") == "b1")
        refused_after_s = time.perf_counter() - sent_s
        assert refused["type"] == "error" and refused["code"] == "overloaded", refused
        assert "capacity of 2" in refused["message"]
        assert refused_after_s < 1.0  # at once (the figure belongs in the benchmark)
        with pytest.raises(ConnectionClosed) as closed:  # a new socket: 1013
            async with connect(app.ws_url + "/v1/stream") as ws:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        speech = await http.post(
            app.url + "/v1/audio/speech", json={"input": "Hi.", "voice": "alloy"}
        )
        assert speech.status_code == 429 and speech.headers["retry-after"] == "1"
        assert (await http.get(app.url + "/readyz")).status_code == 200
        assert len(engine.open_streams) == 2

        audio_at_refusal = sum(len(speaker.contexts[c].audio) for c in ("a1", "a2"))
        for context in ("a1", "a2"):
            result = await speaker.until_done(context)
            assert result.done is not None and result.done["reason"] == "end"
            # All of it: ~10 ms per character (the sentences' joining spaces are not spoken).
            assert len(result.audio) == result.done["stats"]["audio_ms"] * 48  # 24 kHz s16
            assert result.done["stats"]["audio_ms"] > 0.95 * len(LONG_TEXT) * 10
        assert sum(len(speaker.contexts[c].audio) for c in ("a1", "a2")) > audio_at_refusal

        await other.send(type="start", context="b2")
        assert (await other.until(lambda m: m.get("context") == "b2"))["type"] == "started"
        metrics = parse_exposition((await http.get(app.url + "/metrics")).text)
        assert metrics['streamtts_errors_total{code="overloaded"}'] >= 1
        await speaker.close()
        await other.close()


async def barge_in(app_ws_url: str, text: str) -> tuple[int, float, dict[str, object]]:
    """Cancel on the first audio frame: (audio bytes received in all, seconds to ``done``,
    the ``done``)."""
    client = await StreamClient.open(app_ws_url)
    await client.send(type="start", context="c")
    await client.send(type="text", context="c", text=text)
    await client.send(type="end", context="c")
    while client.contexts["c"].first_audio_s is None:
        await client.receive_one()
    cancelled_s = time.perf_counter()
    await client.send(type="cancel", context="c")
    result = await client.until_done("c")
    took_s = time.perf_counter() - cancelled_s
    await client.close()
    assert result.done is not None
    return len(result.audio), took_s, result.done


async def test_pacing_bounds_what_a_barge_in_leaves_in_flight() -> None:
    """An engine that hands over 6 s of audio at once (as Piper hands over a clause): paced at
    500 ms, a cancel on the first frame leaves at most the bound (plus a frame) in flight;
    unpaced, all of it was on its way."""
    text = LONG_TEXT * 2  # about 6 s at 10 ms per character
    settings = Settings().replace(max_send_ahead_ms=500)

    def engine() -> FakeEngine:
        return FakeEngine(chunk_samples=len(text) * 160)  # one chunk

    async with serve_app(engine(), settings, paced=True) as app:
        paced_bytes, paced_s, done = await barge_in(app.ws_url, text)
    bytes_per_ms = 48  # 24 kHz s16le, the default format
    assert done["reason"] == "cancel"
    assert paced_bytes <= (500 + 200 + 50) * bytes_per_ms, paced_bytes  # bound + one frame
    assert paced_s < 1.0
    async with serve_app(engine(), settings) as app:
        unpaced_bytes, _, _ = await barge_in(app.ws_url, text)
    assert unpaced_bytes > 3000 * bytes_per_ms, unpaced_bytes
