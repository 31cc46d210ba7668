"""Turning a WebSocket away the way its protocol says (``Refusal``): an HTTP status for the
handshake where the server supports the ASGI denial-response extension and the protocol wants
one, else accept, the protocol's frames, and a close code (so browsers see the code)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketState

from streamtts.server.dialects.base import Refusal

DENIAL_EXTENSION = "websocket.http.response"
MAX_CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's payload is at most 125 bytes


def truncate_reason(reason: str) -> str:
    """``reason`` cut to what a close frame can carry (whole UTF-8 characters)."""
    return reason.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")


async def send_refusal(ws: WebSocket, refusal: Refusal, subprotocol: str | None) -> None:
    if ws.client_state is WebSocketState.CONNECTING:
        message = await ws.receive()
        if message["type"] != "websocket.connect":
            return  # the client is gone already
    if refusal.http_status is not None and DENIAL_EXTENSION in ws.scope.get("extensions", {}):
        response = Response(
            refusal.http_body, status_code=refusal.http_status, media_type="application/json"
        )
        await ws.send_denial_response(response)
        return
    await ws.accept(subprotocol=subprotocol)
    for frame in refusal.frames:
        await ws.send_text(frame)
    await ws.close(refusal.close_code, truncate_reason(refusal.reason))
