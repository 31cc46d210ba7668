"""The ASGI application: routes, lifespan (engine start/stop) and readiness."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from streamtts.config import Settings
from streamtts.engine.base import Engine
from streamtts.engine.factory import create_engine
from streamtts.server import openai
from streamtts.server.stream import serve_stream

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"


class AppState:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.ready = False


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> Starlette:
    settings = settings or Settings.from_env()
    state = AppState(settings, engine or create_engine(settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        log.info("loading model %s", settings.model)
        await state.engine.start()
        state.ready = True
        log.info("ready: engine %s at %d Hz", state.engine.name, state.engine.sample_rate)
        try:
            yield
        finally:
            state.ready = False
            await state.engine.stop()

    async def healthz(request: Request) -> Response:
        healthy = state.engine.healthy()
        return JSONResponse(
            {"status": "ok" if healthy else "unhealthy"}, status_code=200 if healthy else 503
        )

    async def readyz(request: Request) -> Response:
        ready = state.ready and state.engine.healthy()
        return JSONResponse(
            {"ready": ready, "model": settings.model}, status_code=200 if ready else 503
        )

    async def voices(request: Request) -> Response:
        return JSONResponse(
            {
                "voices": [vars(v) for v in state.engine.voices()],
                "default": state.engine.default_voice,
            }
        )

    async def models(request: Request) -> Response:
        return openai.models_response(state.engine)

    async def speech(request: Request) -> Response:
        return await openai.speech(request, state.engine, settings)

    async def stream(ws: WebSocket) -> None:
        await serve_stream(ws, state.engine, settings)

    routes = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/v1/voices", voices),
        Route("/v1/audio/voices", voices),
        Route("/v1/models", models),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        WebSocketRoute("/v1/stream", stream),
    ]
    if STATIC_DIR.is_dir():
        routes.append(Mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="static"))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.streamtts = state
    return app
