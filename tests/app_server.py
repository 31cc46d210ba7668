"""The real app on a real uvicorn server on 127.0.0.1, in this process and event loop, with an
engine of the test's choosing (the ``create_app(engine=...)`` seam)."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp

from streamtts.config import Settings
from streamtts.engine.base import Engine
from streamtts.server.app import create_app
from streamtts.server.state import AppState
from streamtts.server.uvicorn_config import uvicorn_config
from tests.servers import UNPACED_MS, free_port

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunningApp:
    url: str
    ws_url: str
    state: AppState


@asynccontextmanager
async def serve_app(
    engine: Engine,
    settings: Settings | None = None,
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
    admit_by_capacity: bool = False,
    paced: bool = False,
) -> AsyncIterator[RunningApp]:
    """``settings.ssl_certfile``/``ssl_keyfile`` make it an https:// / wss:// server; ``wrap``
    puts an ASGI layer (a wire recorder, say) around the app; ``admit_by_capacity`` is off
    unless asked, since it depends on the machine's speed; so is pacing (``paced``: the
    settings' ``max_send_ahead_ms``), which makes every utterance take its real-time length."""
    port = free_port()
    settings = (settings or Settings()).replace(port=port, admit_by_capacity=admit_by_capacity)
    if not paced:
        settings = settings.replace(max_send_ahead_ms=UNPACED_MS)
    if not settings.voices.data_dir and not settings.voices.voices_dir:
        settings = settings.replace(data_dir=tempfile.mkdtemp(prefix="streamtts-test-"))
    app = create_app(settings, engine)
    config = uvicorn_config(
        app if wrap is None else wrap(app),
        settings,
        host="127.0.0.1",
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while not server.started:
                if task.done():
                    task.result()  # raises the start-up error
                    raise RuntimeError("uvicorn exited before it started")
                await asyncio.sleep(0.02)
        scheme = "https" if settings.tls else "http"
        url = f"{scheme}://127.0.0.1:{port}"
        yield RunningApp(url, url.replace("http", "ws", 1), app.state.streamtts)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, START_TIMEOUT_S)


@contextmanager
def serve_app_in_thread(engine: Engine, settings: Settings | None = None) -> Iterator[RunningApp]:
    """:func:`serve_app` on an event loop of its own thread, for synchronous clients (the
    hypothesis fuzzers)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    found: list[RunningApp | BaseException] = []

    async def main() -> None:
        try:
            async with serve_app(engine, settings) as app:
                found.append(app)
                ready.set()
                await stop.wait()
        except BaseException as exc:
            found.append(exc)
            ready.set()
            raise

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    ready.wait(START_TIMEOUT_S)
    if not found or isinstance(found[0], BaseException):
        raise RuntimeError("the in-thread server did not start") from (found or [None])[0]
    try:
        yield found[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(START_TIMEOUT_S)
        loop.close()


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait until ``condition()`` holds (polled every 20 ms); TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.02)
