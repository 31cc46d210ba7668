"""The Wyoming server (Home Assistant's voice pipeline): TCP, in the app's process, on the same
engine, admission control, lifecycle and metrics as the HTTP server.

One :class:`WyomingConnection` per TCP connection reads events with bounded framing
(``streamtts.wyoming.framing``), lets the I/O-free :class:`~streamtts.wyoming.conversation.
Conversation` decide, and carries out its actions: session effects through a
:class:`ContextHost` (ticket, engine stream, ``ContextRunner``), events written to the socket.
Writes never wait for the client; a client that lets more than ``max_output_buffer_ms`` of audio
pile up unread is cut off (``slow_consumer``), as on the WebSocket.

Wyoming has no authentication: a bind beyond loopback logs a loud warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from wyoming.error import Error
from wyoming.event import Event

from streamtts.protocol import ErrorCode
from streamtts.server.auth import is_loopback
from streamtts.server.context_host import ContextHost
from streamtts.server.discovery import WyomingAdvertisement
from streamtts.server.outbox import SlowConsumerError
from streamtts.server.state import AppState
from streamtts.wyoming.conversation import (
    SAMPLE_WIDTH_BYTES,
    SHUTTING_DOWN,
    Action,
    CloseConnection,
    Conversation,
    SendEvent,
)
from streamtts.wyoming.framing import (
    FrameBounds,
    FramingError,
    encode_event,
    merge_data,
    parse_header,
)

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05  # buffered streaming text is checked against its maximum delay this often
SHUTDOWN_FLUSH_S = 2.0  # how long a shutdown waits for the last events to reach the client
# After its last event the server half-closes and reads what the client still sends for this
# long, so a client that was still writing reads the answer instead of a connection reset.
LINGER_S = 1.0
PAYLOAD_READ_BYTES = 64 * 1024  # a dropped payload is read in pieces of this size
STOP_TIMEOUT_S = 5.0

UNAUTHENTICATED_WARNING = (
    "!!! SECURITY: the Wyoming server is listening on %s:%d, and Wyoming has no "
    "authentication: anyone who can reach this address can use the TTS (API keys do not apply "
    "to it). Bind it to 127.0.0.1 (STREAMTTS_WYOMING_HOST) or firewall the port. !!!"
)


class WyomingServer:
    """The listener: started after the engine is ready, stopped by the app's lifespan."""

    def __init__(self, state: AppState) -> None:
        self._state = state
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._advertisement: WyomingAdvertisement | None = None
        self.port = 0

    async def start(self) -> None:
        settings = self._state.settings
        wyoming = settings.wyoming
        host = settings.wyoming_host
        self._server = await asyncio.start_server(
            self._on_connection, host, wyoming.wyoming_port, limit=wyoming.wyoming_max_line_bytes
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("Wyoming server listening on %s:%d", host, self.port)
        if not is_loopback(host):
            log.warning(UNAUTHENTICATED_WARNING, host, self.port)
        if wyoming.wyoming_zeroconf:
            name = wyoming.wyoming_zeroconf_name
            self._advertisement = WyomingAdvertisement(host, self.port, name)
            await self._advertisement.start()

    async def stop(self) -> None:
        if self._advertisement is not None:
            await self._advertisement.stop()
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=STOP_TIMEOUT_S)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), STOP_TIMEOUT_S)

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await WyomingConnection(reader, writer, self._state).serve()
        except asyncio.CancelledError:
            pass  # the server stops: the connection's own cleanup has run
        finally:
            self._connections.discard(task)


class WyomingConnection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: AppState
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._state = state
        settings = state.settings
        self._bounds = FrameBounds.from_settings(settings.wyoming)
        self._idle_timeout_s = settings.limits.idle_timeout_s
        engine = state.engine
        self._rate_hz = engine.sample_rate
        self._conversation = Conversation(
            state.voices.infos,
            engine.default_voice,
            self._rate_hz,
            settings.segmenter,
            settings.limits,
        )
        # Home Assistant plays a plain synthesize only once it has all of it: not paced.
        self._host = ContextHost(
            state, self._on_message, self._on_audio, paced=lambda: self._conversation.streaming
        )
        # Audio bytes that may wait unread in the socket's buffer: max_output_buffer_ms of it.
        self._max_buffered_bytes = int(
            settings.limits.max_output_buffer_ms / 1000 * self._rate_hz * SAMPLE_WIDTH_BYTES
        )
        self._closing = asyncio.Event()
        self._eof = False
        self._last_activity_s = time.monotonic()

    # ---- lifecycle ----

    async def serve(self) -> None:
        lifecycle = self._state.lifecycle
        if lifecycle.draining or not lifecycle.ready:
            self._state.metrics.rejected_total.labels("shutting_down").inc()
            self._write_event(Error(text="the server is shutting down", code=SHUTTING_DOWN).event())
            await self._close()
            return
        lifecycle.register(self)
        tasks = [
            asyncio.create_task(self._read_loop(), name="wyoming-read"),
            asyncio.create_task(self._tick(), name="wyoming-tick"),
        ]
        try:
            await self._closing.wait()
        finally:
            lifecycle.unregister(self)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._host.abandon()
            await self._close()

    async def shutdown(self) -> None:
        """The drain's grace is over: end the response in flight with an ``error``
        (``shutting_down``) and close, after a short wait for the last events to be written."""
        await self._perform(self._conversation.shutting_down())
        await self._host.shutdown()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), SHUTDOWN_FLUSH_S)

    async def _close(self) -> None:
        writer = self._writer
        if not writer.is_closing():
            with contextlib.suppress(ConnectionError, OSError, TimeoutError):
                await asyncio.wait_for(writer.drain(), SHUTDOWN_FLUSH_S)
                if writer.can_write_eof():
                    writer.write_eof()
                await asyncio.wait_for(self._discard_input(), LINGER_S)
            writer.close()
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), SHUTDOWN_FLUSH_S)

    async def _discard_input(self) -> None:
        while not self._eof and await self._reader.read(PAYLOAD_READ_BYTES):
            pass

    # ---- reading ----

    async def _read_loop(self) -> None:
        try:
            while not self._conversation.closed:
                try:
                    event = await self._read_event()
                except FramingError as exc:
                    self._write_event(Error(text=exc.message, code=str(exc.code)).event())
                    self._closing.set()
                    return
                if event is None:
                    self._eof = True
                    break
                self._last_activity_s = time.monotonic()
                await self._perform(self._conversation.handle(event, _now_ms()))
        except (ConnectionError, OSError):
            self._closing.set()  # the peer is gone
            return
        except Exception:
            log.exception("Wyoming connection failed")
            self._write_event(Error(text="internal server error", code=ErrorCode.INTERNAL).event())
            self._closing.set()
            return
        # At the end of the client's stream a response in flight is still finished (a client
        # may half-close after its request); the connection closes after it. (After an error
        # the conversation is closed and has asked for the connection to close.)
        if self._eof and not self._conversation.busy:
            self._closing.set()

    async def _read_event(self) -> Event | None:
        """The next event, or None at the end of the stream. Reads no more than the bounds."""
        reader = self._reader
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            return None
        except asyncio.LimitOverrunError:
            raise FramingError(
                ErrorCode.MESSAGE_TOO_BIG,
                f"an event header line is longer than {self._bounds.max_line_bytes} bytes",
            ) from None
        header = parse_header(line, self._bounds)
        try:
            data_block = await reader.readexactly(header.data_length)
            data = merge_data(header, data_block)
            remaining = header.payload_length  # a TTS server takes no payload: dropped
            while remaining:
                remaining -= len(await reader.readexactly(min(remaining, PAYLOAD_READ_BYTES)))
        except asyncio.IncompleteReadError:
            return None
        return Event(type=header.type, data=data)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            if self._writer.is_closing():  # reset by the peer, or cut as a slow consumer
                self._closing.set()
                return
            busy = self._host.busy(self._conversation.context)
            await self._perform(self._conversation.poll(_now_ms(), busy))
            idle_s = time.monotonic() - self._last_activity_s
            if not self._conversation.busy and idle_s > self._idle_timeout_s:
                log.info("Wyoming connection idle for %.0f s: closed", idle_s)
                self._closing.set()
                return

    # ---- actions ----

    async def _perform(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, SendEvent):
                self._write_event(action.event)
            elif isinstance(action, CloseConnection):
                self._closing.set()
            else:
                await self._host.apply([action])

    async def _on_message(self, message: dict[str, object]) -> None:
        """A native message of the response in flight (from the host or its runner)."""
        await self._perform(self._conversation.on_message(message, _now_ms()))
        if self._eof and not self._conversation.busy:
            self._closing.set()

    async def _on_audio(self, context: str, payload: bytes, ms: float) -> None:
        self._write_event(self._conversation.audio(payload, ms).event)
        transport = self._writer.transport
        if transport.get_write_buffer_size() > self._max_buffered_bytes:
            log.info("Wyoming client does not read its audio: connection cut")
            transport.abort()
            raise SlowConsumerError("the client is not reading its audio; the connection is cut")

    def _write_event(self, event: Event) -> None:
        if Error.is_type(event.type):
            self._state.metrics.errors_total.labels(str(event.data.get("code"))).inc()
        if not self._writer.is_closing():
            self._writer.write(encode_event(event))


def _now_ms() -> float:
    return time.monotonic() * 1000.0
