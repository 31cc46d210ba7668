"""A small real WebSocket client for the native protocol, used by the end-to-end tests."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from streamtts.protocol import split_audio_frame

RECEIVE_TIMEOUT_S = 60.0


@dataclass
class ContextResult:
    audio: bytearray = field(default_factory=bytearray)
    messages: list[dict[str, Any]] = field(default_factory=list)
    first_audio_s: float | None = None
    audio_after_done: int = 0

    @property
    def done(self) -> dict[str, Any] | None:
        return next((m for m in self.messages if m["type"] == "done"), None)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]


class StreamClient:
    """Collects everything the server sends, per context (and context-less errors)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.contexts: dict[str, ContextResult] = defaultdict(ContextResult)
        self.errors: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, ws_url: str) -> StreamClient:
        return cls(await connect(ws_url + "/v1/stream", max_size=None))

    async def send(self, **message: Any) -> None:
        await self.ws.send(orjson.dumps(message).decode())

    async def receive_one(self, timeout_s: float = RECEIVE_TIMEOUT_S) -> dict[str, Any] | None:
        """Receive one frame; returns the JSON message, or None for audio."""
        frame = await asyncio.wait_for(self.ws.recv(), timeout_s)
        if isinstance(frame, bytes):
            context, payload = split_audio_frame(frame)
            result = self.contexts[context]
            if result.first_audio_s is None:
                result.first_audio_s = time.perf_counter()
            if result.done is not None:
                result.audio_after_done += len(payload)
            result.audio.extend(payload)
            return None
        message: dict[str, Any] = orjson.loads(frame)
        if "context" in message:
            self.contexts[message["context"]].messages.append(message)
        if message["type"] == "error" and "context" not in message:
            self.errors.append(message)
        return message

    async def until(self, predicate: Any, timeout_s: float = RECEIVE_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("condition not met in time")
            message = await self.receive_one(remaining)
            if message is not None and predicate(message):
                return message

    async def until_done(self, context: str, timeout_s: float = RECEIVE_TIMEOUT_S) -> ContextResult:
        await self.until(lambda m: m["type"] == "done" and m.get("context") == context, timeout_s)
        return self.contexts[context]

    async def speak(
        self, context: str, text: str, encoding: str = "pcm_s16le", sample_rate: int = 24000
    ) -> ContextResult:
        fmt = {"encoding": encoding, "sample_rate": sample_rate}
        await self.send(type="start", context=context, format=fmt)
        await self.send(type="text", context=context, text=text)
        await self.send(type="end", context=context)
        return await self.until_done(context)

    async def close(self) -> None:
        await self.ws.close()
