"""``GET /v1/tts/live``: the Fish Audio live WebSocket, every frame a binary msgpack map
(``streamtts.fishapi.live``), on the native session core: the :class:`~streamtts.session.Session`
segments the text (the first sentence is spoken while the rest is still coming), a
:class:`ContextHost` runs the one context (admission ticket, engine stream, ``ContextRunner``),
and one :class:`Outbox` sends the frames in order with the per-context audio bound
(``slow_consumer``).

One request per socket: ``start`` opens it, ``text`` / ``flush`` / ``stop`` feed it, the server
answers ``audio`` events as the audio is encoded (the request's format: pcm, wav, mp3, opus) and
one ``finish`` (``stop``, or ``error`` with a ``code`` and ``message``), then closes the socket.

(A thin shell of its own: the native socket's shell, ``streamtts.server.stream``, is being
generalised into dialects separately.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from streamtts.audio import ContainerEncoder, decode_samples, make_container_encoder
from streamtts.engine.base import ClonedVoice, EngineError
from streamtts.fishapi.live import (
    LiveError,
    LiveEvent,
    LiveFlush,
    LiveStart,
    LiveStop,
    LiveText,
    audio_event,
    finish_event,
    parse_event,
)
from streamtts.fishapi.request import FishRequestError
from streamtts.protocol import (
    AudioFormat,
    ClientMessage,
    CloseCode,
    EndMessage,
    ErrorCode,
    FlushMessage,
    StartMessage,
    TextMessage,
)
from streamtts.server.auth import SUBPROTOCOL_SCOPE_KEY
from streamtts.server.context_host import ContextHost
from streamtts.server.errors import wire_error
from streamtts.server.fishapi import fish_voice, refusal_message
from streamtts.server.outbox import Outbox
from streamtts.server.state import AppState
from streamtts.session import CancelContext, Send, Session
from streamtts.voices.catalog import INLINE_VOICE_ID, VoiceCatalog

CONTEXT = "live"
RUNNER_ENCODING = "pcm_f32le"  # what the runner hands over; encoded here into the format
POLL_INTERVAL_S = 0.05
SHUTDOWN_FLUSH_S = 2.0
SHUTTING_DOWN = "shutting_down"


class FishLiveSocket:
    def __init__(self, ws: WebSocket, state: AppState) -> None:
        self._ws = ws
        self._state = state
        self._engine = engine = state.engine
        self._limits = limits = state.settings.limits
        self._voices = _LiveVoices(state.voices)
        self._session = Session(
            voices=self._voices,
            default_voice=engine.default_voice,
            segmenter_options=state.settings.segmenter,
            limits=limits,
        )
        self._outbox = Outbox(
            ws,
            limits.max_output_buffer_ms,
            state.add_output_buffer_bytes,
        )
        self._host = ContextHost(
            state,
            self._on_message,
            self._on_audio,
            self._session.context_finished,
            self._outbox,
            resolve_voice=self._voices.resolve,
        )
        self._encoder: ContainerEncoder | None = None
        self._started = False
        self._finished = False  # finish was queued: the socket closes after it
        self._last_activity_s = time.monotonic()

    # ---- lifecycle ----

    async def serve(self) -> None:
        lifecycle, metrics = self._state.lifecycle, self._state.metrics
        refusal = None
        if lifecycle.draining:
            refusal = (CloseCode.GOING_AWAY, "server shutting down", "shutting_down")
        elif self._state.admission.full:
            refusal = (CloseCode.OVERLOADED, "server overloaded", "overloaded")
        await self._ws.accept(subprotocol=self._ws.scope.get(SUBPROTOCOL_SCOPE_KEY))
        if refusal is not None:
            metrics.rejected_total.labels(refusal[2]).inc()
            await self._ws.close(refusal[0], refusal[1])
            return
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
            await self._host.abandon()
            if self._encoder is not None:
                self._encoder.close()

    async def shutdown(self) -> None:
        """The grace period is over: the request ends with ``finish`` ``error``
        (``shutting_down``), the socket closes with 1001."""
        if self._host.contexts:
            await self._host.shutdown()  # its done (reason shutdown) finishes the socket
        else:
            self._finish_error(SHUTTING_DOWN, "the server is shutting down", CloseCode.GOING_AWAY)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._outbox.empty.wait(), SHUTDOWN_FLUSH_S)

    async def _receive_loop(self) -> None:
        while True:
            try:
                frame = await self._ws.receive()
            except WebSocketDisconnect:
                return
            if frame["type"] == "websocket.disconnect":
                return
            self._last_activity_s = time.monotonic()
            if not self._finished:
                await self._on_frame(frame)

    async def _tick(self) -> None:
        while not self._outbox.closed:
            await asyncio.sleep(POLL_INTERVAL_S)
            busy = [CONTEXT] if self._host.busy(CONTEXT) else []
            await self._apply(self._session.poll(_now_ms(), busy))
            idle_s = time.monotonic() - self._last_activity_s
            if not self._host.contexts and idle_s > self._limits.idle_timeout_s:
                self._outbox.close(CloseCode.POLICY, "idle timeout")
                return

    # ---- the client's frames ----

    async def _on_frame(self, frame: Mapping[str, Any]) -> None:
        data = frame.get("bytes")
        if data is None:
            self._fail(ErrorCode.BINARY_NOT_SUPPORTED, "frames must be binary msgpack maps")
            return
        limit = self._limits.max_ws_message_bytes
        if len(data) > limit:
            self._fail(ErrorCode.MESSAGE_TOO_BIG, f"a frame exceeds {limit} bytes")
            return
        try:
            event = parse_event(data, self._limits)
        except LiveError as exc:
            self._fail(exc.code, exc.message)
            return
        await self._on_event(event)

    async def _on_event(self, event: LiveEvent) -> None:
        if isinstance(event, LiveStart):
            await self._start(event)
            return
        if not self._started:
            self._fail(ErrorCode.UNKNOWN_CONTEXT, "send 'start' first")
            return
        message: ClientMessage
        if isinstance(event, LiveText):
            message = TextMessage(CONTEXT, event.text)
        elif isinstance(event, LiveFlush):
            message = FlushMessage(CONTEXT)
        else:
            assert isinstance(event, LiveStop)
            message = EndMessage(CONTEXT)
        await self._apply(self._session.handle(message, _now_ms()))

    async def _start(self, event: LiveStart) -> None:
        if self._started:
            self._fail(ErrorCode.CONTEXT_EXISTS, "'start' was sent already: one request per socket")
            return
        request = event.request
        try:
            found = await fish_voice(self._state.voices, request)
        except FishRequestError as exc:
            self._fail(exc.code, exc.message)
            return
        except EngineError as exc:
            self._fail(wire_error(exc).code, refusal_message(exc))
            return
        if isinstance(found, ClonedVoice):
            self._voices.inline = found
            voice = INLINE_VOICE_ID
        else:
            voice = found
        self._started = True
        rate_hz = request.sample_rate_hz or self._engine.sample_rate
        self._encoder = make_container_encoder(request.format, rate_hz, request.bit_rate_bps)
        fmt = AudioFormat(RUNNER_ENCODING, rate_hz)
        now_ms = _now_ms()
        effects = self._session.handle(StartMessage(CONTEXT, voice, fmt, request.options), now_ms)
        if request.text:
            effects += self._session.handle(TextMessage(CONTEXT, request.text), now_ms)
        await self._apply(effects)

    async def _apply(self, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, Send):  # a session error: the request ends with it
                message = effect.message
                self._fail(str(message["code"]), str(message["message"]))
                closing = self._session.close()
                await self._host.apply(e for e in closing if isinstance(e, CancelContext))
                return
            await self._host.apply([effect])

    # ---- the runner's messages and audio ----

    async def _on_message(self, message: dict[str, object]) -> None:
        kind = message.get("type")
        if kind == "error":
            self._fail(str(message["code"]), str(message["message"]))
        elif kind == "done":
            reason = message.get("reason")
            if reason == "end":
                assert self._encoder is not None
                tail = self._encoder.finish()
                if tail:  # the context's audio is settled: the tail goes as a control frame
                    self._outbox.queue_control(audio_event(tail))
                self._finish(finish_event("stop"), CloseCode.NORMAL)
            elif reason == "shutdown":
                shutting_down = "the server is shutting down"
                self._finish_error(SHUTTING_DOWN, shutting_down, CloseCode.GOING_AWAY)
            # error: answered already; cancel: the socket is gone

    async def _on_audio(self, context: str, payload: bytes, ms: float) -> None:
        assert self._encoder is not None
        encoded = self._encoder.write(decode_samples(payload, RUNNER_ENCODING))
        if encoded:
            self._outbox.queue_audio(context, audio_event(encoded), len(encoded), ms)

    # ---- ending ----

    def _fail(self, code: str, message: str) -> None:
        self._finish_error(code, message, CloseCode.NORMAL)

    def _finish_error(self, code: str, message: str, close_code: int) -> None:
        self._state.metrics.errors_total.labels(code).inc()
        self._finish(finish_event("error", code, message), close_code)

    def _finish(self, event: bytes, close_code: int) -> None:
        if self._finished:
            return
        self._finished = True
        self._outbox.queue_control(event)
        self._outbox.close(close_code, "")


class _LiveVoices:
    """The catalog's voices, and the request's inline reference voice once it has one."""

    def __init__(self, catalog: VoiceCatalog) -> None:
        self._catalog = catalog
        self.inline: ClonedVoice | None = None

    def __contains__(self, voice_id: object) -> bool:
        if voice_id == INLINE_VOICE_ID and self.inline is not None:
            return True
        return voice_id in self._catalog

    def resolve(self, voice_id: str) -> str | ClonedVoice:
        if voice_id == INLINE_VOICE_ID and self.inline is not None:
            return self.inline
        return self._catalog.resolve(voice_id)


async def serve_fish_live(ws: WebSocket, state: AppState) -> None:
    await FishLiveSocket(ws, state).serve()


def _now_ms() -> float:
    return time.monotonic() * 1000.0
