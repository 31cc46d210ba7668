"""Graceful shutdown on SIGTERM, and fault isolation: a failing job fails its context only; a
dead worker thread makes the server unready and ends the process with a non-zero code."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from streamtts.engine.faults import JOB_FAULT, WORKER_FAULT
from tests.servers import ServerProcess
from tests.ws_client import StreamClient

GRACE_S = 3.0
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."


async def wait_exit(server: ServerProcess, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = server.proc.poll()
        if code is not None:
            return code
        await asyncio.sleep(0.05)
    raise TimeoutError(f"server still running after {timeout_s} s")


async def close_code_of_new_socket(server: ServerProcess) -> int | None:
    ws = await connect(server.ws_url + "/v1/stream", open_timeout=5)
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()
    return closed.value.rcvd.code if closed.value.rcvd else None


async def test_sigterm_drains_then_ends_what_is_left_and_exits_0() -> None:
    server = ServerProcess(env={"STREAMTTS_SHUTDOWN_GRACE_S": str(GRACE_S)})
    try:
        server.wait_ready()
        client = await StreamClient.open(server.ws_url)
        # "long": open, speaking, never ended by the client; "short": ends during the grace.
        for context in ("long", "short"):
            await client.send(type="start", context=context)
            await client.until(lambda m, c=context: m["type"] == "started" and m["context"] == c)
        await client.send(type="text", context="long", text=SENTENCE + " And more")
        await client.until(lambda m: m["type"] == "segment" and m["context"] == "long")

        signalled_s = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        async with httpx.AsyncClient(base_url=server.url, timeout=2) as http:
            ready = await http.get("/readyz")
            readiness_s = time.monotonic() - signalled_s
            assert ready.status_code == 503 and ready.json()["draining"] is True
            assert readiness_s < 0.5, readiness_s
            speech = await http.post(
                "/v1/audio/speech", json={"input": "Hello.", "response_format": "pcm"}
            )
            assert speech.status_code == 503
            assert speech.json()["error"]["code"] == "shutting_down"
        assert await close_code_of_new_socket(server) == 1001

        # The in-flight context that the client ends finishes normally during the grace.
        await client.send(type="text", context="short", text=SENTENCE)
        await client.send(type="end", context="short")
        short = await client.until_done("short", timeout_s=GRACE_S)
        assert short.done is not None and short.done["reason"] == "end"
        assert len(short.audio) > 24_000
        assert time.monotonic() - signalled_s < GRACE_S

        # A new context on the open socket is refused while draining.
        await client.send(type="start", context="late")
        late = await client.until(lambda m: m.get("context") == "late", timeout_s=2)
        assert late["type"] == "error" and late["code"] == "overloaded"

        # The one left open ends with reason "shutdown" once the grace is over.
        long = await client.until_done("long", timeout_s=GRACE_S + 3)
        ended_s = time.monotonic() - signalled_s
        assert long.done is not None and long.done["reason"] == "shutdown"
        assert GRACE_S - 0.5 < ended_s < GRACE_S + 2, ended_s
        with pytest.raises(ConnectionClosed) as closed:
            await client.receive_one(timeout_s=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001

        assert await wait_exit(server, 10) == 0
    finally:
        server.stop()


async def test_sigterm_with_nothing_in_flight_exits_at_once() -> None:
    server = ServerProcess(env={"STREAMTTS_SHUTDOWN_GRACE_S": "30"})
    try:
        server.wait_ready()
        client = await StreamClient.open(server.ws_url)  # an idle socket does not hold it up
        result = await client.speak("a", "Hello there.")
        assert result.done is not None and result.done["reason"] == "end"
        started_s = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert await wait_exit(server, 10) == 0
        assert time.monotonic() - started_s < 5
    finally:
        server.stop()


def fault_server() -> ServerProcess:
    return ServerProcess(
        "--model",
        "synthetic:tiny",
        env={
            "STREAMTTS_DTYPE": "fp32",
            "STREAMTTS_TEST_FAULT_INJECTION": "1",
            "STREAMTTS_WATCHDOG_INTERVAL_S": "0.2",
        },
    )


async def test_a_failing_job_fails_its_context_only_then_a_dead_worker_ends_the_process() -> None:
    server = fault_server()
    try:
        server.wait_ready()
        client = await StreamClient.open(server.ws_url)
        for context in ("bad", "good"):
            await client.send(type="start", context=context)
        await client.send(type="text", context="bad", text=f"Break {JOB_FAULT} here.")
        await client.send(type="end", context="bad")
        await client.send(type="text", context="good", text="Three short words.")
        await client.send(type="end", context="good")
        bad = await client.until_done("bad")
        good = await client.until_done("good")
        assert [e["code"] for e in bad.of_type("error")] == ["internal"]
        assert bad.done is not None and bad.done["reason"] == "error"
        assert good.done is not None and good.done["reason"] == "end"
        assert len(good.audio) > 0 and not good.of_type("error")
        # The worker survived: the server is ready and still speaks.
        assert httpx.get(server.url + "/readyz").status_code == 200
        again = await client.speak("again", "Still here.")
        assert again.done is not None and again.done["reason"] == "end"

        # Now kill the generator thread itself.
        await client.send(type="start", context="fatal")
        await client.send(type="text", context="fatal", text=f"Die {WORKER_FAULT} now.")
        await client.send(type="end", context="fatal")
        killed_s = time.monotonic()
        saw_unready = False
        while server.proc.poll() is None and time.monotonic() - killed_s < 10:
            with contextlib.suppress(httpx.HTTPError):
                saw_unready |= httpx.get(server.url + "/readyz", timeout=1).status_code == 503
            await asyncio.sleep(0.05)
        code = await wait_exit(server, 10)
        assert code not in (0, None) and code > 0, code  # exits by itself, non-zero
        log = server.log_path.read_text()
        assert "generator thread died" in log
        # The watchdog noticed (readiness false) and stopped the process.
        assert "fatal: an engine worker thread died" in log
        print(f"saw /readyz 503 before exit: {saw_unready}")
    finally:
        server.stop()
