"""Carries out the session core's effects for one connection of a protocol shell: an admission
ticket, an engine stream and a :class:`ContextRunner` per context, released when the context
ends. The shell translates its protocol into session messages and the runner's native messages
(``started``, ``segment``, ``flushed``, ``error``, ``done``) back into its protocol (and counts
the errors it sends); everything between — admission, engine refusals, barge-in, shutdown —
happens here once.

(The native socket, ``streamtts.server.stream``, does the same inline; the Wyoming and Fish live
shells share this.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol

from streamtts.engine.base import ClonedVoice, EngineError
from streamtts.protocol import ErrorCode, error, started
from streamtts.server.admission import Ticket
from streamtts.server.context_runner import ContextRunner, SendBytes, SendJson
from streamtts.server.errors import wire_error
from streamtts.server.state import AppState
from streamtts.session import (
    CancelContext,
    OpenContext,
    PrepareSegment,
    QueueEnd,
    QueueFlushMark,
    QueueSegment,
)

HostEffect = OpenContext | QueueSegment | PrepareSegment | QueueFlushMark | QueueEnd | CancelContext


class AudioBuffer(Protocol):
    """A shell's queue of audio not yet taken by its client (``Outbox``)."""

    def open_context(self, context: str) -> None: ...

    def forget_context(self, context: str) -> None: ...

    def drop_audio(self, context: str) -> None: ...


class ContextHost:
    def __init__(
        self,
        state: AppState,
        send_message: SendJson,
        send_audio: SendBytes,
        on_finished: Callable[[str], None] = lambda context: None,
        audio_buffer: AudioBuffer | None = None,
        resolve_voice: Callable[[str], str | ClonedVoice] | None = None,
        paced: Callable[[], bool] = lambda: True,
    ) -> None:
        """``paced``: asked as each context opens, whether its audio is paced
        (``max_send_ahead_ms``); a shell whose client downloads whole responses says no."""
        self._state = state
        self._send_message = send_message
        self._send_audio = send_audio
        self._on_finished = on_finished  # after the context's last message (done, or a refusal)
        self._audio_buffer = audio_buffer
        self._resolve_voice = resolve_voice or state.voices.resolve
        self._paced = paced
        self._runners: dict[str, ContextRunner] = {}
        self._tickets: dict[str, Ticket] = {}

    @property
    def contexts(self) -> list[str]:
        return list(self._runners)

    def busy(self, context: str) -> bool:
        runner = self._runners.get(context)
        return runner is not None and runner.busy

    async def apply(self, effects: Iterable[HostEffect]) -> None:
        for effect in effects:
            if isinstance(effect, OpenContext):
                await self._open(effect)
                continue
            if isinstance(effect, CancelContext):
                await self.cancel(effect.context)
                continue
            runner = self._runners.get(effect.context)
            if runner is None:
                continue  # the context was refused (its error is sent) or has ended
            if isinstance(effect, QueueSegment):
                runner.queue_segment(effect.text)
            elif isinstance(effect, PrepareSegment):
                runner.prepare_segment(effect.text)
            elif isinstance(effect, QueueFlushMark):
                runner.queue_flush_mark()
            else:
                runner.queue_end()

    async def cancel(self, context: str, reason: str = "cancel") -> None:
        """Barge-in: queued audio is dropped, the engine stream stopped, ``done`` sent."""
        runner = self._runners.get(context)
        if runner is not None:
            if self._audio_buffer is not None:
                self._audio_buffer.drop_audio(context)
            await runner.cancel(reason)

    async def shutdown(self) -> None:
        """The grace period is over: every context ends with ``done`` reason ``shutdown``."""
        await asyncio.gather(*(r.cancel("shutdown") for r in list(self._runners.values())))

    async def abandon(self) -> None:
        """The connection is gone: stop everything, send nothing, release every ticket."""
        await asyncio.gather(*(r.abandon() for r in list(self._runners.values())))
        self._runners.clear()
        for context in list(self._tickets):
            self._release(context)

    # ---- opening and ending ----

    async def _open(self, effect: OpenContext) -> None:
        context = effect.context
        refusal = self._admit(context)
        if refusal is not None:
            await self._refuse(context, ErrorCode.OVERLOADED, refusal)
            return
        try:
            voice = self._resolve_voice(effect.voice)
            stream = self._state.engine.open_stream(voice, effect.options)
        except EngineError as exc:
            self._release(context)
            wire = wire_error(exc)
            await self._refuse(context, wire.code, wire.message)
            return
        if self._audio_buffer is not None:
            self._audio_buffer.open_context(context)
        self._runners[context] = ContextRunner(
            context=context,
            stream=stream,
            fmt=effect.format,
            send_json=self._send,
            send_audio=self._send_audio,
            on_finished=self._finished,
            metrics=self._state.metrics,
            max_send_ahead_ms=self._state.settings.scheduling.max_send_ahead_ms
            if self._paced()
            else None,
            beyond_capacity=self._tickets[context].beyond_capacity,
        )
        await self._send(started(context, effect.format))

    async def _refuse(self, context: str, code: str, message: str) -> None:
        await self._send(error(code, message, context))
        self._on_finished(context)

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

    def _finished(self, context: str) -> None:
        if self._runners.pop(context, None) is None and context not in self._tickets:
            return  # reported already (at its done, and by the runner after it)
        if self._audio_buffer is not None:
            self._audio_buffer.forget_context(context)
        self._release(context)
        self._on_finished(context)

    async def _send(self, message: dict[str, object]) -> None:
        if message.get("type") == "done":
            # Released before the shell hears of it, so a request the shell starts on hearing it
            # finds the ticket and the engine slot free.
            self._finished(str(message["context"]))
        await self._send_message(message)
