"""The WebSocket shell shared by every streaming protocol (native ``/v1/stream``, ElevenLabs,
Cartesia): I/O, admission, the outbox, the runners and the drain; the protocol is a dialect.

A frame is translated by the socket's dialect (``streamtts.server.dialects``) into actions; the
session state machine (``streamtts.session``) decides on its messages and the effects are carried
out with one :class:`ContextRunner` per context. Every frame to the client goes through one
outbox per socket, sent in order by one writer task, so frames never interleave and a slow
client never blocks the contexts' tasks; each context's audio still waiting in the outbox is
bounded (``max_output_buffer_ms``). Every event of a context is rendered by the dialect, so
limits, admission, metrics, slow-consumer handling and graceful shutdown are the same for every
protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from streamtts.engine.base import EngineError
from streamtts.protocol import ClientMessage, CloseCode, ErrorCode, StartMessage
from streamtts.server.admission import Ticket
from streamtts.server.auth import SUBPROTOCOL_SCOPE_KEY
from streamtts.server.context_runner import ContextRunner
from streamtts.server.dialects.base import (
    Action,
    Close,
    Dialect,
    RefusalCause,
    Reject,
    RejectionOutput,
    Reply,
)
from streamtts.server.errors import wire_error
from streamtts.server.outbox import Outbox
from streamtts.server.refusal import send_refusal, truncate_reason
from streamtts.server.state import AppState
from streamtts.session import (
    CancelContext,
    Effect,
    OpenContext,
    PrepareSegment,
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
    def __init__(self, ws: WebSocket, state: AppState, dialect: Dialect) -> None:
        self._ws = ws
        self._state = state
        self._dialect = dialect
        self._engine = state.engine
        self._settings = settings = state.settings
        self._session = Session(
            voices=state.voices,
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
            await self._refuse(RefusalCause.SHUTTING_DOWN, "server shutting down")
            return
        if self._state.admission.full:
            await self._refuse(RefusalCause.OVERLOADED, "server overloaded")
            return
        await self._ws.accept(subprotocol=self._ws.scope.get(SUBPROTOCOL_SCOPE_KEY))
        lifecycle.register(self)
        writer = asyncio.create_task(self._outbox.run())
        ticker = asyncio.create_task(self._tick())
        try:
            await self._perform(self._dialect.opening())
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

    async def _refuse(self, cause: RefusalCause, message: str) -> None:
        self._state.metrics.rejected_total.labels(str(cause)).inc()
        refusal = self._dialect.refusal(cause, message)
        await send_refusal(self._ws, refusal, self._ws.scope.get(SUBPROTOCOL_SCOPE_KEY))

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
            if not self._outbox.closing:  # a close is on its way: the rest goes unanswered
                await self._perform(self._decode(frame))

    def _decode(self, frame: Mapping[str, Any]) -> list[Action]:
        data: str | bytes | None = frame.get("text")
        if data is None:
            data = frame.get("bytes") or b""
        limit = self._settings.limits.max_ws_message_bytes
        if len(data) > limit or (
            isinstance(data, str) and len(data) * 4 > limit and len(data.encode()) > limit
        ):
            return [Reject(ErrorCode.MESSAGE_TOO_BIG, f"message exceeds {limit} bytes")]
        return self._dialect.decode(data)

    async def _tick(self) -> None:
        while not self._outbox.closed:
            await asyncio.sleep(POLL_INTERVAL_S)
            busy = [c for c, runner in self._runners.items() if runner.busy]
            await self._apply(self._session.poll(_now_ms(), busy))
            idle_s = time.monotonic() - self._last_activity_s
            timeout_s = self._dialect.idle_timeout_s or self._settings.limits.idle_timeout_s
            quiet = not busy if self._dialect.idle_while_open else not self._runners
            if quiet and idle_s > timeout_s and not self._outbox.closing:
                await self._perform(self._dialect.idle())
                return

    # ---- actions (from the dialect) ----

    async def _perform(self, actions: Sequence[Action | RejectionOutput]) -> None:
        """Carry out a dialect's actions in order. Once a message of a context is refused, the
        rest of the batch for that context is dropped: one frame is one request."""
        refused: set[str] = set()
        for action in actions:
            if isinstance(action, Reply):
                self._outbox.queue_control(action.frame)
            elif isinstance(action, Close):
                self._outbox.close(action.code, truncate_reason(action.reason))
            elif isinstance(action, Reject):
                if action.context is not None:
                    refused.add(action.context)
                await self._reject(action.code, action.message, action.context)
            elif action.context not in refused and not await self._deliver(action):
                refused.add(action.context)

    async def _reject(self, code: ErrorCode, message: str, context: str | None) -> None:
        self._state.metrics.errors_total.labels(str(code)).inc()
        await self._perform(self._dialect.rejected(code, message, context))

    async def _deliver(self, message: ClientMessage) -> bool:
        """Apply one session message; False if it was refused."""
        if isinstance(message, StartMessage):
            await self._state.voices.refresh_on_miss(message.voice)  # another replica's voice?
        effects = self._session.handle(message, _now_ms())
        accepted = True
        for effect in effects:
            if isinstance(effect, Send):  # the session's refusal, as a native error
                accepted = False
                error = effect.message
                code, text = ErrorCode(str(error["code"])), str(error["message"])
                if isinstance(message, StartMessage):
                    await self._refuse_start(message.context, code, text)
                else:
                    await self._reject(code, text, message.context)
            elif isinstance(effect, OpenContext):
                accepted = await self._open(effect)
            else:
                await self._apply([effect])
        return accepted

    # ---- effects (from the session) ----

    async def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                error, context = effect.message, effect.message.get("context")
                code, text = ErrorCode(str(error["code"])), str(error["message"])
                await self._reject(code, text, None if context is None else str(context))
            elif isinstance(effect, OpenContext):
                await self._open(effect)
            elif isinstance(effect, QueueSegment):
                self._runner(effect.context).queue_segment(effect.text)
            elif isinstance(effect, PrepareSegment):
                self._runner(effect.context).prepare_segment(effect.text)
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

    async def _open(self, effect: OpenContext) -> bool:
        refusal = self._admit(effect.context)
        if refusal is not None:
            # The session already counted the context: let it go again.
            self._session.context_finished(effect.context)
            await self._refuse_start(effect.context, ErrorCode.OVERLOADED, refusal)
            return False
        try:
            voice = self._state.voices.resolve(effect.voice)
            stream = self._engine.open_stream(voice, effect.options)
        except EngineError as exc:
            self._release(effect.context)
            self._session.context_finished(effect.context)
            wire = wire_error(exc)
            await self._refuse_start(effect.context, wire.code, wire.message)
            return False
        self._outbox.open_context(effect.context)
        self._runners[effect.context] = ContextRunner(
            context=effect.context,
            stream=stream,
            fmt=effect.format,
            send_json=self._send_json,
            send_audio=self._send_audio,
            on_finished=self._on_context_finished,
            metrics=self._state.metrics,
            max_send_ahead_ms=self._settings.scheduling.max_send_ahead_ms,
            beyond_capacity=self._tickets[effect.context].beyond_capacity,
        )
        await self._perform(self._dialect.started(effect.context, effect.format))
        return True

    async def _refuse_start(self, context: str, code: ErrorCode, message: str) -> None:
        self._state.metrics.errors_total.labels(str(code)).inc()
        await self._perform(self._dialect.start_refused(context, code, message))

    def _admit(self, context: str) -> str | None:
        """Take an admission ticket for ``context``; the refusal's message if there is none."""
        ticket = self._state.admit_context()
        if isinstance(ticket, str):
            return ticket
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
        """A context's native event (segment, flushed, done, error), in the dialect's frames."""
        if message.get("type") == "error":
            self._state.metrics.errors_total.labels(str(message.get("code"))).inc()
        await self._perform(self._dialect.event(message))

    async def _send_audio(self, context: str, payload: bytes, ms: float) -> None:
        frame = self._dialect.audio(context, payload)
        if frame is not None:
            self._outbox.queue_audio(context, frame, len(payload), ms)


async def serve_socket(ws: WebSocket, state: AppState, dialect: Dialect) -> None:
    await StreamSocket(ws, state, dialect).serve()


def _now_ms() -> float:
    return time.monotonic() * 1000.0
