"""One context's audio pipeline: engine stream → resampler → encoder → client frames.

A runner owns an asyncio task that takes queued work (segments, flush marks, the end) in
order. It never touches torch: the engine stream hands back numpy PCM from its own threads.

Sends do not wait for the client: they queue on the socket's outbox. When a context's queued
audio passes its bound, ``send_audio`` raises :class:`SlowConsumerError` and the context ends
with an ``error`` (code ``slow_consumer``) and ``done`` reason ``error``.

Pacing (``max_send_ahead_ms``): the runner keeps a playback clock of the audio it has sent — the
listener starts hearing at the first frame and hears in real time — and sends a frame only while
the context is less than ``max_send_ahead_ms`` ahead of it; the rest waits here (in the engine
stream's hand-off), where a cancel drops it. So a barge-in leaves at most that much audio in
flight. Audio held back on purpose is not queued on the outbox, so it never counts towards
``max_output_buffer_ms``: a client that reads its socket never gets ``slow_consumer``. A frame
sent after the listener ran out of audio while the stream was playing is late (an underrun the
listener heard): it is counted, and the clock resumes from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from streamtts.audio import StreamingResampler, make_stream_encoder
from streamtts.engine.base import EngineError, EngineStream, PcmF32
from streamtts.protocol import AudioFormat, ErrorCode, done, error, flushed, segment
from streamtts.scheduling import PlaybackClock
from streamtts.server.errors import wire_error
from streamtts.server.metrics import Metrics
from streamtts.server.outbox import SlowConsumerError

log = logging.getLogger(__name__)

# Largest audio payload per binary frame; keeps frames small enough to interleave contexts.
MAX_FRAME_MS = 200


@dataclass(frozen=True)
class _Segment:
    text: str
    queued_s: float


@dataclass(frozen=True)
class _FlushMark:
    pass


@dataclass(frozen=True)
class _End:
    pass


_Work = _Segment | _FlushMark | _End

SendJson = Callable[[dict[str, object]], Awaitable[None]]
# (context, payload, duration of the payload in ms)
SendBytes = Callable[[str, bytes, float], Awaitable[None]]


class ContextRunner:
    """Runs one context. ``on_finished`` is called after ``done`` was sent (possibly more than
    once: it must be idempotent)."""

    def __init__(
        self,
        context: str,
        stream: EngineStream,
        fmt: AudioFormat,
        send_json: SendJson,
        send_audio: SendBytes,
        on_finished: Callable[[str], None],
        metrics: Metrics | None = None,
        max_send_ahead_ms: float | None = None,
        beyond_capacity: bool = False,
    ) -> None:
        """``max_send_ahead_ms``: the pacing bound (None: send as fast as the engine makes it,
        for tests of the runner alone); ``beyond_capacity``: admitted alone on an idle server
        whose engine is slower than real time (``done`` stats say so)."""
        self.context = context
        self._stream = stream
        self._engine_rate_hz = stream.sample_rate
        self._fmt = fmt
        self._send_json = send_json
        self._send_audio = send_audio
        self._on_finished = on_finished
        self._metrics = metrics
        self._max_send_ahead_s = None if max_send_ahead_ms is None else max_send_ahead_ms / 1000
        self._beyond_capacity = beyond_capacity
        self._played = PlaybackClock()  # the listener's playback of the audio sent so far
        self._segment_arrived_s = 0.0  # when the segment being spoken was queued
        self._queue: asyncio.Queue[_Work] = asyncio.Queue()
        self._resampler = StreamingResampler(self._engine_rate_hz, fmt.sample_rate)
        self._encoder = make_stream_encoder(fmt.encoding, fmt.sample_rate, fmt.bit_rate_bps)
        self._frame_samples = max(1, fmt.sample_rate * MAX_FRAME_MS // 1000)
        self._audio_samples_out = 0
        self._first_queued_s: float | None = None
        self._first_audio_s: float | None = None
        self._finished = False
        self._segments_pending = 0
        self._task = asyncio.create_task(self._run(), name=f"context:{context}")

    # ---- called by the socket shell ----

    @property
    def busy(self) -> bool:
        """Segments are queued or being synthesised."""
        return self._segments_pending > 0

    def queue_segment(self, text: str) -> None:
        self._segments_pending += 1
        now = time.perf_counter()
        if self._first_queued_s is None:
            self._first_queued_s = now
        self._queue.put_nowait(_Segment(text, now))

    def prepare_segment(self, text: str) -> None:
        """``text`` is likely the next segment: the engine may start on it, if the context
        has nothing queued or being spoken (its listener waits in silence)."""
        if not self.busy and not self._finished:
            self._stream.prepare(text)

    def queue_flush_mark(self) -> None:
        self._queue.put_nowait(_FlushMark())

    def queue_end(self) -> None:
        self._queue.put_nowait(_End())

    async def cancel(self, reason: str = "cancel") -> None:
        """Barge-in: stop the engine, drop queued work, then send ``done`` with ``reason``."""
        if self._finished:
            return
        await self._stop_task()
        if not self._finished:  # the task may have sent ``done`` itself just before
            await self._finish(reason)
        self._on_finished(self.context)

    async def abandon(self) -> None:
        """The socket is gone: stop everything, send nothing."""
        await self._stop_task()
        self._stream.close()
        self._encoder.close()
        if not self._finished:
            self._finished = True
            self._count_end("disconnect")

    async def _stop_task(self) -> None:
        self._stream.cancel()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # ---- the task ----

    async def _run(self) -> None:
        try:
            while True:
                work = await self._queue.get()
                if isinstance(work, _Segment):
                    self._segment_arrived_s = work.queued_s
                    await self._speak(work.text)
                    self._segments_pending -= 1
                elif isinstance(work, _FlushMark):
                    await self._send_json(flushed(self.context))
                else:
                    await self._send_encoder_tail()
                    await self._finish("end")
                    return
        except asyncio.CancelledError:
            raise
        except SlowConsumerError as exc:
            await self._fail(ErrorCode.SLOW_CONSUMER, str(exc))
        except EngineError as exc:
            wire = wire_error(exc)
            await self._fail(wire.code, wire.message)
        except Exception:
            log.exception("context %s failed", self.context)
            await self._fail(ErrorCode.INTERNAL, "internal error while synthesising")

    async def _speak(self, text: str) -> None:
        start_ms = self._audio_ms()
        async for pcm in self._stream.synthesize(text):
            await self._send_pcm(self._resampler.process(pcm))
        # Deliver the resampler's tail so the segment's audio is complete and its end_ms exact.
        await self._drain_resampler()
        await self._send_json(segment(self.context, text, start_ms, self._audio_ms()))

    async def _drain_resampler(self) -> None:
        # The resampler holds a few milliseconds. A fresh resampler after a segment costs
        # nothing audible: segments end at sentence or clause boundaries.
        await self._send_pcm(self._resampler.flush())
        self._resampler = StreamingResampler(self._engine_rate_hz, self._fmt.sample_rate)

    async def _send_pcm(self, pcm: PcmF32) -> None:
        for start in range(0, pcm.size, self._frame_samples):
            piece = pcm[start : start + self._frame_samples]
            payload = self._encoder.write(np.ascontiguousarray(piece))
            self._audio_samples_out += piece.size
            if not payload:  # a compressed stream's codec holds the samples for its next frame
                continue
            seconds = piece.size / self._fmt.sample_rate
            await self._pace()
            await self._send_audio(self.context, payload, 1000.0 * seconds)
            self._played_out(seconds)
            if self._first_audio_s is None:
                self._first_audio_s = time.perf_counter()
                if self._metrics is not None and self._first_queued_s is not None:
                    ttfa_ms = 1000.0 * (self._first_audio_s - self._first_queued_s)
                    self._metrics.ttfa_ms.observe(ttfa_ms)

    async def _pace(self) -> None:
        """Wait until the context is less than ``max_send_ahead_ms`` ahead of its listener."""
        if self._max_send_ahead_s is None:
            return
        excess_s = self._played.lead_s(time.perf_counter()) - self._max_send_ahead_s
        if excess_s > 0:
            await asyncio.sleep(excess_s)

    def _played_out(self, seconds: float) -> None:
        """``seconds`` of audio went to the socket now: advance the playback clock."""
        now_s = time.perf_counter()
        clock = self._played
        runs_out_s = clock.runs_out_s
        if runs_out_s is not None and now_s > runs_out_s:
            # The listener had heard everything. If this segment's text came while it was still
            # hearing the one before, the audio is late: a gap it heard.
            if runs_out_s > self._segment_arrived_s and self._metrics is not None:
                self._metrics.late_audio_total.inc()
                self._metrics.late_audio_seconds_total.inc(now_s - runs_out_s)
            clock.resumed(now_s)
        clock.produced(seconds, now_s)
        if self._metrics is not None:
            self._metrics.lead_ms.observe(1000.0 * clock.lead_s(now_s))

    async def _send_encoder_tail(self) -> None:
        """A compressed stream's last frame (raw encodings have none)."""
        tail = self._encoder.finish()
        if tail:
            await self._send_audio(self.context, tail, 0.0)

    async def _fail(self, code: str, message: str) -> None:
        await self._send_json(error(code, message, self.context))
        await self._finish("error")

    async def _finish(self, reason: str) -> None:
        self._finished = True
        self._stream.close()
        self._encoder.close()
        self._count_end(reason)
        # Shielded: a cancel racing with the end must not swallow the one ``done``.
        await asyncio.shield(self._send_json(done(self.context, reason, self.stats())))
        self._on_finished(self.context)

    # ---- figures ----

    def _count_end(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.contexts_total.labels(reason).inc()

    def _audio_ms(self) -> float:
        return 1000.0 * self._audio_samples_out / self._fmt.sample_rate

    def stats(self) -> dict[str, float | bool | None]:
        ttfa_ms = None
        if self._first_audio_s is not None and self._first_queued_s is not None:
            ttfa_ms = round(1000.0 * (self._first_audio_s - self._first_queued_s), 1)
        audio_ms = self._audio_ms()
        compute_s = self._stream.stats.compute_s
        rtf = round(1000.0 * compute_s / audio_ms, 4) if audio_ms > 0 else None
        found: dict[str, float | bool | None] = {
            "ttfa_ms": ttfa_ms,
            "audio_ms": round(audio_ms, 1),
            "rtf": rtf,
        }
        if self._beyond_capacity:
            found["beyond_capacity"] = True
        return found
