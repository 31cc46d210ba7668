"""A wire tap for in-process servers: an ASGI layer that records every WebSocket frame each way,
stamped with ``time.monotonic()`` (the clock the client scripts stamp their events with)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send


@dataclass(frozen=True)
class Frame:
    t: float
    incoming: bool  # client → server
    text: str | None = None
    data: bytes | None = None

    def json(self) -> dict[str, Any] | None:
        if self.text is None:
            return None
        try:
            value = orjson.loads(self.text)
        except orjson.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None


@dataclass
class Connection:
    path: str
    headers: dict[str, str]
    query: str
    frames: list[Frame] = field(default_factory=list)
    close_code: int | None = None

    def sent(self) -> list[dict[str, Any]]:
        """The server's JSON frames, in order."""
        return [j for f in self.frames if not f.incoming and (j := f.json()) is not None]

    def received(self) -> list[dict[str, Any]]:
        """The client's JSON frames, in order."""
        return [j for f in self.frames if f.incoming and (j := f.json()) is not None]


class WireRecorder:
    def __init__(self) -> None:
        self.connections: list[Connection] = []

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def tapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "websocket":
                await app(scope, receive, send)
                return
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            conn = Connection(scope["path"], headers, scope["query_string"].decode("latin-1"))
            self.connections.append(conn)

            async def receive_tapped() -> Message:
                message = await receive()
                if message["type"] == "websocket.receive":
                    conn.frames.append(
                        Frame(time.monotonic(), True, message.get("text"), message.get("bytes"))
                    )
                return message

            async def send_tapped(message: Message) -> None:
                if message["type"] == "websocket.send":
                    conn.frames.append(
                        Frame(time.monotonic(), False, message.get("text"), message.get("bytes"))
                    )
                elif message["type"] == "websocket.close":
                    conn.close_code = message.get("code", 1000)
                await send(message)

            await app(scope, receive_tapped, send_tapped)

        return tapped
