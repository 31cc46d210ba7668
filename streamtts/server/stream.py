"""``GET /v1/stream``: the native WebSocket protocol's I/O shell.

It parses frames (``streamtts.protocol``), lets the session state machine decide
(``streamtts.session``) and carries out the effects with one :class:`ContextRunner` per
context. Every frame to the client goes through one outbox per socket, sent in order by one
writer task, so frames never interleave and a slow client never blocks the contexts' tasks;
each context's audio still waiting in the outbox is bounded (``max_output_buffer_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from streamtts.engine.base import EngineError
from streamtts.protocol import (
    CloseCode,
    ErrorCode,
    ProtocolError,
    dumps,
    error,
    parse_client_message,
    started,
)
from streamtts.server.admission import Ticket
from streamtts.server.auth import SUBPROTOCOL_SCOPE_KEY
from streamtts.server.context_runner import ContextRunner
from streamtts.server.errors import wire_error
from streamtts.server.outbox import Outbox
from streamtts.server.state import AppState
from streamtts.session import (
    CancelContext,
    Effect,
    OpenContext,
    QueueEnd,
    QueueFlushMark,
    QueueSegment,
    Send,
    Session,
)

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05  # how often buffered text is checked against its maximum delay
# Control messages (errors, mostly) waiting for a client that does not read; beyond this the
# socket stops reading the client's frames until the backlog is sent.
MAX_PENDING_CONTROL = 256
# How long a shutdown waits for the goodbye frames (done, close) to reach the client.
SHUTDOWN_FLUSH_S = 2.0


class StreamSocket:
    def __init__(self, ws: WebSocket, state: AppState) -> None:
        self._ws = ws
        self._state = state
        self._engine = state.engine
        self._settings = settings = state.settings
        self._session = Session(
            voices=frozenset(v.id for v in self._engine.voices()),
            default_voice=self._engine.default_voice,
            segmenter_options=settings.segmenter,
            limits=settings.limits,
        )
        self._runners: dict[str, ContextRunner] = {}
        self._tickets: dict[str, Ticket] = {}
        self._outbox = Outbox(
            ws, settings.limits.max_output_buffer_ms, state.add_output_buffer_bytes
        )
        self._last_activity_s = time.monotonic()

    # ---- lifecycle ----

    async def serve(self) -> None:
        lifecycle = self._state.lifecycle
        if lifecycle.draining:
            await self._refuse(CloseCode.GOING_AWAY, "server shutting down", "shutting_down")
            return
        if self._state.admission.full:
            await self._refuse(CloseCode.OVERLOADED, "server overloaded", "overloaded")
            return
        await self._ws.accept(subprotocol=self._ws.scope.get(SUBPROTOCOL_SCOPE_KEY))
        lifecycle.register(self)
        writer = asyncio.create_task(self._outbox.run())
        ticker = asyncio.create_task(self._tick())
        try:
            await self._receive_loop()
        finally:
            lifecycle.unregister(self)
            ticker.cancel()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            self._session.close()
            await asyncio.gather(*(r.abandon() for r in list(self._runners.values())))
            self._runners.clear()
            for context in list(self._tickets):
                self._release(context)

    async def _refuse(self, code: int, reason: str, cause: str) -> None:
        self._state.metrics.rejected_total.labels(cause).inc()
        await self._ws.accept(subprotocol=self._ws.scope.get(SUBPROTOCOL_SCOPE_KEY))
        await self._ws.close(code, reason)

    async def shutdown(self) -> None:
        """End every context with ``done`` reason ``shutdown``, then close with 1001."""
        await asyncio.gather(*(r.cancel("shutdown") for r in list(self._runners.values())))
        self._outbox.close(CloseCode.GOING_AWAY, "server shutting down")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._outbox.empty.wait(), SHUTDOWN_FLUSH_S)

    async def _receive_loop(self) -> None:
        while True:
            # A client that does not read its answers is not read either (bounded memory).
            while self._outbox.pending_control > MAX_PENDING_CONTROL and not self._outbox.closed:
                await self._outbox.empty.wait()
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
        limits = self._settings.limits
        limit = limits.max_ws_message_bytes
        if len(text) > limit or (len(text) * 4 > limit and len(text.encode()) > limit):
            await self._send_json(
                error(ErrorCode.MESSAGE_TOO_BIG, f"message exceeds {limit} bytes")
            )
            return
        try:
            message = parse_client_message(text, limits.max_text_per_message_chars)
        except ProtocolError as exc:
            await self._send_json(error(exc.code, exc.message, exc.context))
            return
        await self._apply(self._session.handle(message, _now_ms()))

    async def _tick(self) -> None:
        while not self._outbox.closed:
            await asyncio.sleep(POLL_INTERVAL_S)
            busy = [c for c, runner in self._runners.items() if runner.busy]
            await self._apply(self._session.poll(_now_ms(), busy))
            idle_s = time.monotonic() - self._last_activity_s
            if not self._runners and idle_s > self._settings.limits.idle_timeout_s:
                self._outbox.close(CloseCode.POLICY, "idle timeout")
                return

    # ---- effects ----

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
                    self._outbox.drop_audio(effect.context)  # barge-in: queued audio goes
                    await runner.cancel()

    def _runner(self, context: str) -> ContextRunner:
        return self._runners[context]

    async def _open(self, effect: OpenContext) -> None:
        refusal = self._admit(effect.context)
        if refusal is not None:
            # The session already counted the context: let it go again.
            self._session.context_finished(effect.context)
            await self._send_json(error(ErrorCode.OVERLOADED, refusal, effect.context))
            return
        try:
            stream = self._engine.open_stream(effect.voice, effect.options)
        except EngineError as exc:
            self._release(effect.context)
            self._session.context_finished(effect.context)
            wire = wire_error(exc)
            await self._send_json(error(wire.code, wire.message, effect.context))
            return
        self._outbox.open_context(effect.context)
        self._runners[effect.context] = ContextRunner(
            context=effect.context,
            stream=stream,
            engine_rate_hz=self._engine.sample_rate,
            fmt=effect.format,
            send_json=self._send_json,
            send_audio=self._send_audio,
            on_finished=self._on_context_finished,
            metrics=self._state.metrics,
        )
        await self._send_json(started(effect.context, effect.format))

    def _admit(self, context: str) -> str | None:
        """Take an admission ticket for ``context``; the refusal's message if there is none."""
        if self._state.lifecycle.draining:
            return "the server is shutting down; reconnect to another instance"
        ticket = self._state.admission.try_acquire()
        if ticket is None:
            return (
                f"the server is at its limit of {self._state.admission.limit} active "
                "contexts; try again shortly"
            )
        self._tickets[context] = ticket
        return None

    def _release(self, context: str) -> None:
        ticket = self._tickets.pop(context, None)
        if ticket is not None:
            ticket.release()

    def _on_context_finished(self, context: str) -> None:
        self._runners.pop(context, None)
        self._outbox.forget_context(context)
        self._release(context)
        self._session.context_finished(context)

    async def _send_json(self, message: dict[str, object]) -> None:
        if message.get("type") == "error":
            self._state.metrics.errors_total.labels(str(message.get("code"))).inc()
        self._outbox.queue_text(dumps(message))

    async def _send_audio(self, context: str, payload: bytes, ms: float) -> None:
        self._outbox.queue_audio(context, payload, ms)


async def serve_stream(ws: WebSocket, state: AppState) -> None:
    await StreamSocket(ws, state).serve()


def _now_ms() -> float:
    return time.monotonic() * 1000.0
