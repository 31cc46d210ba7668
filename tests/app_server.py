"""The real app on a real uvicorn server on 127.0.0.1, in this process and event loop, with an
engine of the test's choosing (the ``create_app(engine=...)`` seam)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn

from streamtts.config import Settings
from streamtts.engine.base import Engine
from streamtts.server.app import create_app
from streamtts.server.state import AppState
from tests.servers import free_port

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunningApp:
    url: str
    ws_url: str
    state: AppState


@asynccontextmanager
async def serve_app(engine: Engine, settings: Settings | None = None) -> AsyncIterator[RunningApp]:
    port = free_port()
    settings = (settings or Settings()).replace(port=port)
    app = create_app(settings, engine)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while not server.started:
                if task.done():
                    task.result()  # raises the start-up error
                    raise RuntimeError("uvicorn exited before it started")
                await asyncio.sleep(0.02)
        url = f"http://127.0.0.1:{port}"
        yield RunningApp(url, url.replace("http://", "ws://"), app.state.streamtts)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, START_TIMEOUT_S)


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait until ``condition()`` holds (polled every 20 ms); TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.02)
