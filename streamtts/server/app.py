"""The ASGI application: routes, lifespan (engine start/stop, watchdog), readiness, metrics and
the security middleware (API keys, browser origins)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from streamtts import hugepages
from streamtts.config import Settings
from streamtts.engine.base import Engine
from streamtts.engine.factory import create_engine
from streamtts.heap import release_freed_heap
from streamtts.server import fishapi, openai
from streamtts.server import voices as server_voices
from streamtts.server.auth import ApiKeys, OriginPolicy, SecurityMiddleware
from streamtts.server.fish_live import serve_fish_live
from streamtts.server.metrics import CONTENT_TYPE, Metrics
from streamtts.server.shutdown import watchdog
from streamtts.server.sockets import dialect_for_path, socket_routes
from streamtts.server.state import AppState
from streamtts.server.wyoming import WyomingServer

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"

__all__ = ["AppState", "create_app"]


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> Starlette:
    settings = settings or Settings.from_env()
    state = AppState(settings, engine or create_engine(settings))
    lifecycle = state.lifecycle
    keys = ApiKeys.from_settings(settings)
    _register_gauges(state.metrics, state)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        log.info("loading model %s", settings.model)
        await state.engine.start()
        await state.voices.refresh()
        log.info(
            "voices: %d offered (library %s)", len(state.voices.listing()), state.voices.directory
        )
        await asyncio.to_thread(release_freed_heap)  # what loading copied and dropped
        log.info("%s", hugepages.summary())
        rescans = asyncio.create_task(state.voices.run_rescans(), name="voice-rescans")
        lifecycle.ready = True
        log.info("ready: engine %s at %d Hz", state.engine.name, state.engine.sample_rate)
        dog = asyncio.create_task(
            watchdog(state.engine, lifecycle, settings.watchdog_interval_s), name="watchdog"
        )
        # Wyoming listens only once the engine is ready: Home Assistant's describe and
        # synthesize are answered from the first connection on.
        wyoming = WyomingServer(state) if settings.wyoming.enabled else None
        try:
            if wyoming is not None:
                await wyoming.start()
            yield
        finally:
            lifecycle.ready = False
            dog.cancel()
            rescans.cancel()
            if wyoming is not None:
                await wyoming.stop()
            await state.engine.stop()

    async def healthz(request: Request) -> Response:
        healthy = state.engine.healthy()
        return JSONResponse(
            {"status": "ok" if healthy else "unhealthy"}, status_code=200 if healthy else 503
        )

    async def readyz(request: Request) -> Response:
        ready = lifecycle.ready and not lifecycle.draining and state.engine.healthy()
        body = {"ready": ready, "model": settings.model, "draining": lifecycle.draining}
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    async def voices(request: Request) -> Response:
        return await server_voices.list_voices(request, state)

    async def voice(request: Request) -> Response:
        if request.method == "DELETE":
            return await server_voices.delete_voice(request, state)
        return await server_voices.get_voice(request, state)

    async def add_voice(request: Request) -> Response:
        return await server_voices.add_voice(request, state)

    async def models(request: Request) -> Response:
        return openai.models_response(state.engine)

    async def speech(request: Request) -> Response:
        return await openai.speech(request, state)

    async def fish_tts(request: Request) -> Response:
        return await fishapi.tts(request, state)

    async def fish_live(ws: WebSocket) -> None:
        await serve_fish_live(ws, state)

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
        Route("/v1/voices", voices, methods=["GET"]),
        Route("/v1/voices", add_voice, methods=["POST"]),
        Route("/v1/voices/{voice_id}", voice, methods=["GET", "DELETE"]),
        Route("/v1/audio/voices", voices, methods=["GET"]),
        Route("/v1/models", models),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/tts", fish_tts, methods=["POST"]),
        *socket_routes(state),
        WebSocketRoute("/v1/tts/live", fish_live),
    ]
    if STATIC_DIR.is_dir():
        routes.append(Mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="static"))
    middleware = [
        Middleware(
            SecurityMiddleware,
            keys=keys,
            origins=OriginPolicy(settings.allowed_origins),
            on_reject=lambda cause: state.metrics.rejected_total.labels(cause).inc(),
            dialect_for_path=dialect_for_path,
        )
    ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.streamtts = state
    return app


def _register_gauges(metrics: Metrics, state: AppState) -> None:
    metrics.gauge("streamtts_ready", "1 when the server accepts work.", lambda: float(state.ready))
    metrics.gauge(
        "streamtts_active_contexts",
        "Admitted contexts and speech requests in flight.",
        lambda: state.admission.active,
    )
    metrics.gauge(
        "streamtts_max_active_contexts",
        "The admission limit (max_active_contexts).",
        lambda: state.admission.limit,
    )
    metrics.gauge(
        "streamtts_realtime_capacity",
        "Streams the engine can keep at real time by its own measured cost, less the headroom.",
        lambda: state.admission.realtime_streams,
    )
    metrics.gauge(
        "streamtts_admission_capacity",
        "Streams admitted at most now: the real-time capacity, capped by max_active_contexts.",
        lambda: state.admission.capacity,
    )
    metrics.gauge(
        "streamtts_capacity_headroom",
        "How many more streams are admitted now (admission capacity - active).",
        lambda: max(0, state.admission.capacity - state.admission.active),
    )
    metrics.gauge(
        "streamtts_capacity_utilization",
        "Active streams over the admission capacity (1: new streams are refused).",
        lambda: state.admission.active / state.admission.capacity,
    )
    metrics.gauge(
        "streamtts_open_sockets",
        "Open streaming WebSockets (every protocol) and Wyoming connections.",
        lambda: state.lifecycle.open_sockets,
    )
    metrics.gauge(
        "streamtts_output_buffer_bytes",
        "Audio bytes queued for clients and not yet taken by their sockets.",
        lambda: state.output_buffer_bytes,
    )
    metrics.gauge(
        "streamtts_engine_free_slots",
        "Free engine stream slots (KV-cache slots), where the engine has them.",
        lambda: _figure(state.engine.capacity().free),
    )
    metrics.gauge(
        "streamtts_engine_capacity",
        "Engine stream slots (KV-cache slots), where the engine has them.",
        lambda: _figure(state.engine.capacity().streams),
    )
    metrics.gauge(
        "streamtts_engine_healthy",
        "1 while every engine worker thread is alive.",
        lambda: float(state.engine.healthy()),
    )


def _figure(value: int | None) -> float | None:
    return None if value is None else float(value)
