"""``GET /v1/stream``: the native WebSocket protocol's I/O shell.

It parses frames (``streamtts.protocol``), lets the session state machine decide
(``streamtts.session``) and carries out the effects with one :class:`ContextRunner` per
context. All sends on a socket go through one lock so frames never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from streamtts.config import Settings
from streamtts.engine.base import Engine, EngineError, SynthesisOptions
from streamtts.protocol import (
    CloseCode,
    ErrorCode,
    ProtocolError,
    audio_frame,
    dumps,
    error,
    parse_client_message,
    started,
)
from streamtts.segmenter import SegmenterOptions
from streamtts.server.context_runner import ContextRunner
from streamtts.session import (
    CancelContext,
    Effect,
    OpenContext,
    QueueEnd,
    QueueFlushMark,
    QueueSegment,
    Send,
    Session,
    SessionLimits,
)

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05  # how often buffered text is checked against its maximum delay


def segmenter_options(settings: Settings) -> SegmenterOptions:
    return SegmenterOptions(
        first_segment_min_chars=settings.first_segment_min_chars,
        max_segment_chars=settings.max_segment_chars,
        max_buffer_delay_ms=settings.max_buffer_delay_ms,
    )


class StreamSocket:
    def __init__(self, ws: WebSocket, engine: Engine, settings: Settings) -> None:
        self._ws = ws
        self._engine = engine
        self._settings = settings
        self._session = Session(
            voices=frozenset(v.id for v in engine.voices()),
            default_voice=engine.default_voice,
            segmenter_options=segmenter_options(settings),
            limits=SessionLimits(
                max_contexts=settings.max_contexts_per_socket,
                max_text_per_context_chars=settings.max_text_per_context_chars,
            ),
        )
        self._runners: dict[str, ContextRunner] = {}
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._last_activity_s = time.monotonic()

    async def serve(self) -> None:
        await self._ws.accept()
        ticker = asyncio.create_task(self._tick())
        try:
            await self._receive_loop()
        finally:
            self._closed = True
            ticker.cancel()
            self._session.close()
            await asyncio.gather(*(r.abandon() for r in list(self._runners.values())))
            self._runners.clear()

    async def _receive_loop(self) -> None:
        while True:
            try:
                frame = await self._ws.receive()
            except WebSocketDisconnect:
                return
            if frame["type"] == "websocket.disconnect":
                return
            self._last_activity_s = time.monotonic()
            await self._on_frame(frame)

    async def _on_frame(self, frame: Mapping[str, Any]) -> None:
        text = frame.get("text")
        if text is None:
            await self._send_json(
                error(
                    ErrorCode.BINARY_NOT_SUPPORTED,
                    "binary frames are not accepted from clients; send JSON text frames",
                )
            )
            return
        limit = self._settings.max_ws_message_bytes
        if len(text) > limit or (len(text) * 4 > limit and len(text.encode()) > limit):
            await self._send_json(
                error(
                    ErrorCode.MESSAGE_TOO_BIG,
                    f"message exceeds {self._settings.max_ws_message_bytes} bytes",
                )
            )
            return
        try:
            message = parse_client_message(text, self._settings.max_text_per_message_chars)
        except ProtocolError as exc:
            await self._send_json(error(exc.code, exc.message, exc.context))
            return
        await self._apply(self._session.handle(message, _now_ms()))

    async def _tick(self) -> None:
        while not self._closed:
            await asyncio.sleep(POLL_INTERVAL_S)
            busy = [c for c, runner in self._runners.items() if runner.busy]
            await self._apply(self._session.poll(_now_ms(), busy))
            idle_s = time.monotonic() - self._last_activity_s
            if not self._runners and idle_s > self._settings.idle_timeout_s:
                await self._close(CloseCode.POLICY, "idle timeout")
                return

    async def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                await self._send_json(effect.message)
            elif isinstance(effect, OpenContext):
                await self._open(effect)
            elif isinstance(effect, QueueSegment):
                self._runner(effect.context).queue_segment(effect.text)
            elif isinstance(effect, QueueFlushMark):
                self._runner(effect.context).queue_flush_mark()
            elif isinstance(effect, QueueEnd):
                self._runner(effect.context).queue_end()
            elif isinstance(effect, CancelContext):
                runner = self._runners.get(effect.context)
                if runner is not None:
                    await runner.cancel()

    def _runner(self, context: str) -> ContextRunner:
        return self._runners[context]

    async def _open(self, effect: OpenContext) -> None:
        try:
            options = SynthesisOptions(**effect.options)  # type: ignore[arg-type]
            stream = self._engine.open_stream(effect.voice, options)
        except EngineError as exc:
            # The session already counted the context: let it go again.
            self._session.context_finished(effect.context)
            await self._send_json(error(exc.code, str(exc), effect.context))
            return
        self._runners[effect.context] = ContextRunner(
            context=effect.context,
            stream=stream,
            engine_rate_hz=self._engine.sample_rate,
            fmt=effect.format,
            send_json=self._send_json,
            send_audio=self._send_audio,
            on_finished=self._on_context_finished,
        )
        await self._send_json(started(effect.context, effect.format))

    def _on_context_finished(self, context: str) -> None:
        self._runners.pop(context, None)
        self._session.context_finished(context)

    async def _send_json(self, message: dict[str, object]) -> None:
        await self._send(lambda: self._ws.send_text(dumps(message)))

    async def _send_audio(self, context: str, payload: bytes) -> None:
        await self._send(lambda: self._ws.send_bytes(audio_frame(context, payload)))

    async def _send(self, do_send: Any) -> None:
        if self._closed:
            return
        async with self._send_lock:
            try:
                await do_send()
            except (WebSocketDisconnect, RuntimeError, OSError):
                self._closed = True

    async def _close(self, code: int, reason: str) -> None:
        async with self._send_lock:
            if not self._closed:
                self._closed = True
                with contextlib.suppress(RuntimeError, OSError):
                    await self._ws.close(code, reason)


async def serve_stream(ws: WebSocket, engine: Engine, settings: Settings) -> None:
    await StreamSocket(ws, engine, settings).serve()


def _now_ms() -> float:
    return time.monotonic() * 1000.0
