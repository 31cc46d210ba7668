"""One socket's outgoing frames: a FIFO sent in order by one writer task.

Contexts queue frames without waiting for the client, so a slow client never blocks a
context's task (nor, through it, the engine). What a slow client costs is bounded instead:
each context's audio waiting here is limited to ``max_output_buffer_ms``; past it
:meth:`Outbox.queue_audio` raises :class:`SlowConsumerError` and that context's queued audio is
dropped. Control messages are small; the socket stops reading a client that lets more than a
few hundred of them pile up (see ``StreamSocket``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect

from streamtts.protocol import audio_frame

# (context, audio payload) -> the binary frame that carries it.
FrameAudio = Callable[[str, bytes], bytes]


class SlowConsumerError(Exception):
    """The client is not taking this context's audio fast enough."""


@dataclass
class _Audio:
    """Audio of one context queued and not yet taken by the socket."""

    context: str
    nbytes: int = 0
    ms: float = 0.0
    dropped: bool = False


@dataclass(frozen=True)
class _Frame:
    text: str | None = None
    data: bytes | None = None  # audio, or a binary control message (``audio`` is None)
    audio: _Audio | None = None
    payload_bytes: int = 0
    ms: float = 0.0
    close: tuple[int, str] | None = None


class Outbox:
    def __init__(
        self,
        ws: WebSocket,
        max_audio_ms: float,
        on_audio_bytes: Callable[[int], None] = lambda delta: None,
        frame_audio: FrameAudio = audio_frame,
    ) -> None:
        self._ws = ws
        self._max_audio_ms = max_audio_ms
        self._on_audio_bytes = on_audio_bytes  # server-wide gauge of queued audio
        self._frame_audio = frame_audio  # the native protocol's frames, unless a dialect's
        self._frames: deque[_Frame] = deque()
        self._audio: dict[str, _Audio] = {}
        self._ready = asyncio.Event()
        self.empty = asyncio.Event()
        self.empty.set()
        self.pending_control = 0
        self.closed = False  # nothing more can be sent
        self._closing = False  # a close frame is queued: queue nothing more

    # ---- contexts ----

    def open_context(self, context: str) -> None:
        self._audio[context] = _Audio(context)

    def forget_context(self, context: str) -> None:
        """The context is done; frames of it still queued are sent (or settled) as usual."""
        self._audio.pop(context, None)

    def drop_audio(self, context: str) -> None:
        """Discard the context's queued audio (cancel, slow consumer): the writer skips it."""
        audio = self._audio.get(context)
        if audio is None or audio.dropped:
            return
        audio.dropped = True
        self._on_audio_bytes(-audio.nbytes)
        audio.nbytes, audio.ms = 0, 0.0

    # ---- queueing ----

    def queue_text(self, text: str) -> None:
        self.pending_control += 1
        self._append(_Frame(text=text))

    def queue_binary(self, data: bytes) -> None:
        """A control message sent as a binary frame (protocols whose frames are all binary)."""
        self.pending_control += 1
        self._append(_Frame(data=data))

    def queue_audio(self, context: str, payload: bytes, ms: float) -> None:
        audio = self._audio.get(context)
        if audio is None or audio.dropped or self._closing or self.closed:
            return
        if audio.ms > 0 and audio.ms + ms > self._max_audio_ms:
            self.drop_audio(context)
            raise SlowConsumerError(
                f"the client is not reading: over {self._max_audio_ms:.0f} ms of audio for this "
                "context are waiting to be sent; the context is dropped"
            )
        audio.nbytes += len(payload)
        audio.ms += ms
        self._on_audio_bytes(len(payload))
        frame = self._frame_audio(context, payload)
        self._append(_Frame(data=frame, audio=audio, payload_bytes=len(payload), ms=ms))

    def close(self, code: int, reason: str) -> None:
        """Queue a close frame after everything already queued."""
        if not (self.closed or self._closing):
            self._append(_Frame(close=(code, reason)))
            self._closing = True

    def _append(self, frame: _Frame) -> None:
        if self.closed or self._closing:
            self._settle(frame)
            return
        self._frames.append(frame)
        self.empty.clear()
        self._ready.set()

    # ---- the writer ----

    async def run(self) -> None:
        """Send frames until the socket is closed or gone; cancel it when the socket ends."""
        try:
            while not self.closed:
                if not self._frames:
                    self.empty.set()
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                await self._write(self._frames.popleft())
        finally:
            self.closed = True
            for frame in self._frames:
                self._settle(frame)
            self._frames.clear()
            self.empty.set()

    async def _write(self, frame: _Frame) -> None:
        try:
            if frame.close is not None:
                self.closed = True
                with contextlib.suppress(RuntimeError, OSError):
                    await self._ws.close(*frame.close)
            elif frame.text is not None:
                await self._ws.send_text(frame.text)
            elif frame.data is not None and not (frame.audio and frame.audio.dropped):
                await self._ws.send_bytes(frame.data)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True
        finally:
            self._settle(frame)

    def _settle(self, frame: _Frame) -> None:
        """The frame left the outbox (sent or not): update the counts."""
        if frame.audio is None and frame.close is None:
            self.pending_control -= 1  # a text or binary control message
        audio = frame.audio
        if audio is not None and not audio.dropped:
            audio.nbytes -= frame.payload_bytes
            audio.ms -= frame.ms
            self._on_audio_bytes(-frame.payload_bytes)
