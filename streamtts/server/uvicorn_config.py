"""How the app runs under uvicorn: one definition for ``streamtts serve`` and the test servers."""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.types import ASGIApp

from streamtts.config import Settings

WS_PING_INTERVAL_S = 20.0
WS_PING_TIMEOUT_S = 20.0
# Our own drain (GracefulServer) has already ended every context by the time uvicorn shuts
# down; this only bounds the wait for connections that will not close.
GRACEFUL_SHUTDOWN_S = 3


def uvicorn_config(app: ASGIApp, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration of ``app`` for ``settings`` (``overrides``: uvicorn options)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        # Frames up to 4x the limit get an `message_too_big` error and the socket stays
        # usable; beyond that the server closes with 1009 without reading them.
        "ws_max_size": settings.limits.max_ws_message_bytes * 4,
        "ws_ping_interval": WS_PING_INTERVAL_S,
        "ws_ping_timeout": WS_PING_TIMEOUT_S,
        # No permessage-deflate: PCM and encoded audio do not compress, and compressing every
        # audio frame took ~45% of the event loop's CPU under load, on the cores synthesis runs
        # on (docs/operations.md, "WebSocket compression").
        "ws_per_message_deflate": False,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
        "ssl_certfile": settings.ssl_certfile or None,
        "ssl_keyfile": settings.ssl_keyfile or None,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)
