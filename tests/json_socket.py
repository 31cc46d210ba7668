"""A small real WebSocket client for the JSON compatibility protocols (ElevenLabs, Cartesia)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

RECEIVE_TIMEOUT_S = 30.0


class JsonSocket:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.received: list[dict[str, Any]] = []

    @classmethod
    async def open(
        cls, url: str, headers: Mapping[str, str] | None = None, **kwargs: Any
    ) -> JsonSocket:
        return cls(await connect(url, additional_headers=headers, max_size=None, **kwargs))

    async def send(self, **message: Any) -> None:
        await self.ws.send(orjson.dumps(message).decode())

    async def recv(self, timeout_s: float = RECEIVE_TIMEOUT_S) -> dict[str, Any]:
        frame = await asyncio.wait_for(self.ws.recv(), timeout_s)
        assert isinstance(frame, str), "these protocols send JSON text frames only"
        message: dict[str, Any] = orjson.loads(frame)
        self.received.append(message)
        return message

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = RECEIVE_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        """Every message up to and including the first that ``predicate`` accepts."""
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout_s):
            while True:
                message = await self.recv()
                seen.append(message)
                if predicate(message):
                    return seen

    async def until_closed(self, timeout_s: float = RECEIVE_TIMEOUT_S) -> list[dict[str, Any]]:
        """Every message until the server closes; the close code is ``close_code``."""
        seen: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    seen.append(await self.recv())
        except ConnectionClosed:
            return seen

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code

    async def close(self) -> None:
        await self.ws.close()


def audio_of(messages: list[dict[str, Any]], key: str = "audio") -> bytes:
    """The decoded audio of the messages that carry it (``audio`` or Cartesia's ``data``)."""
    return b"".join(base64.b64decode(m[key]) for m in messages if m.get(key))
