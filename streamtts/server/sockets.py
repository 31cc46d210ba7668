"""The streaming WebSocket endpoints: one path per protocol, each a dialect over the one shell
(``streamtts.server.stream``), so every protocol gets the same admission, limits, metrics and
shutdown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.routing import WebSocketRoute, compile_path
from starlette.websockets import WebSocket

from streamtts.server.dialects.base import Dialect
from streamtts.server.dialects.cartesia import CartesiaDialect
from streamtts.server.dialects.elevenlabs import ElevenLabsDialect
from streamtts.server.dialects.native import NativeDialect
from streamtts.server.state import AppState
from streamtts.server.stream import serve_socket

DialectFactory = Callable[[WebSocket, AppState], Dialect]


@dataclass(frozen=True)
class SocketRoute:
    path: str  # a Starlette path template
    dialect: type[Dialect]
    make: DialectFactory


def _native(ws: WebSocket, state: AppState) -> Dialect:
    return NativeDialect(state.settings.limits.max_text_per_message_chars)


def _elevenlabs(multi: bool) -> DialectFactory:
    def make(ws: WebSocket, state: AppState) -> Dialect:
        return ElevenLabsDialect(
            voice_id=ws.path_params["voice_id"],
            query=ws.query_params,
            voices=state.voices,
            max_text_chars=state.settings.limits.max_text_per_message_chars,
            multi=multi,
        )

    return make


def _cartesia(ws: WebSocket, state: AppState) -> Dialect:
    return CartesiaDialect(state.settings.limits.max_text_per_message_chars)


SOCKET_ROUTES: tuple[SocketRoute, ...] = (
    SocketRoute("/v1/stream", NativeDialect, _native),
    SocketRoute(
        "/v1/text-to-speech/{voice_id}/stream-input", ElevenLabsDialect, _elevenlabs(False)
    ),
    SocketRoute(
        "/v1/text-to-speech/{voice_id}/multi-stream-input", ElevenLabsDialect, _elevenlabs(True)
    ),
    SocketRoute("/tts/websocket", CartesiaDialect, _cartesia),
)
_PATTERNS = [(compile_path(route.path)[0], route.dialect) for route in SOCKET_ROUTES]


def socket_routes(state: AppState) -> list[WebSocketRoute]:
    def endpoint(route: SocketRoute) -> Callable[[WebSocket], object]:
        async def serve(ws: WebSocket) -> None:
            await serve_socket(ws, state, route.make(ws, state))

        return serve

    return [WebSocketRoute(route.path, endpoint(route)) for route in SOCKET_ROUTES]


def dialect_for_path(path: str) -> type[Dialect]:
    """The protocol spoken at ``path`` (the native one for any other path), for refusals made
    before the endpoint runs (auth, origin)."""
    for pattern, dialect in _PATTERNS:
        if pattern.match(path):
            return dialect
    return NativeDialect
