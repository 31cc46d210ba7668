"""The socket outbox: one writer, frames in order, per-context audio bounded, drops on cancel."""

from __future__ import annotations

import asyncio

import pytest

from streamtts.protocol import audio_frame, split_audio_frame
from streamtts.server.outbox import Outbox, SlowConsumerError


class FakeSocket:
    """Records what is sent; ``reading`` cleared makes it stall like a client that stops reading."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.closed: tuple[int, str] | None = None
        self.reading = asyncio.Event()
        self.reading.set()

    async def send_text(self, text: str) -> None:
        await self.reading.wait()
        self.sent.append(text)

    async def send_bytes(self, data: bytes) -> None:
        await self.reading.wait()
        self.sent.append(split_audio_frame(data))

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


def queue_audio(outbox: Outbox, context: str, payload: bytes, ms: float) -> None:
    """Audio as the native protocol frames it."""
    outbox.queue_audio(context, audio_frame(context, payload), len(payload), ms)


def outbox_for(ws: FakeSocket, max_ms: float = 1000.0) -> tuple[Outbox, list[int]]:
    gauge: list[int] = [0]

    def add(delta: int) -> None:
        gauge[0] += delta

    return Outbox(ws, max_ms, add), gauge  # type: ignore[arg-type]


async def test_frames_go_out_in_order_and_the_gauge_returns_to_zero() -> None:
    ws = FakeSocket()
    outbox, gauge = outbox_for(ws)
    writer = asyncio.create_task(outbox.run())
    outbox.open_context("a")
    outbox.queue_control('{"type":"started"}')
    queue_audio(outbox, "a", b"\x01\x02", 10.0)
    outbox.queue_control('{"type":"done"}')
    await asyncio.wait_for(outbox.empty.wait(), 5)
    assert ws.sent == ['{"type":"started"}', ("a", b"\x01\x02"), '{"type":"done"}']
    assert gauge == [0] and outbox.pending_control == 0
    outbox.close(1000, "bye")
    await asyncio.wait_for(writer, 5)
    assert ws.closed == (1000, "bye") and outbox.closed


async def test_a_context_over_its_audio_bound_is_a_slow_consumer_alone() -> None:
    ws = FakeSocket()
    ws.reading.clear()  # the client stops reading
    outbox, gauge = outbox_for(ws, max_ms=100.0)
    writer = asyncio.create_task(outbox.run())
    outbox.open_context("slow")
    outbox.open_context("other")
    queue_audio(outbox, "slow", b"xx", 60.0)
    queue_audio(outbox, "slow", b"yy", 30.0)
    with pytest.raises(SlowConsumerError):
        queue_audio(outbox, "slow", b"zz", 30.0)
    queue_audio(outbox, "other", b"ok", 60.0)  # another context is not affected
    assert gauge == [2]  # the slow context's queued audio was dropped, the other's counts
    queue_audio(outbox, "slow", b"late", 10.0)  # a dropped context queues nothing more
    ws.reading.set()
    await asyncio.wait_for(outbox.empty.wait(), 5)
    # All of the slow context's queued audio was dropped; the other context's was sent.
    assert ws.sent == [("other", b"ok")] and gauge == [0]
    writer.cancel()


async def test_drop_audio_discards_a_cancelled_contexts_queue_but_keeps_control() -> None:
    ws = FakeSocket()
    ws.reading.clear()
    outbox, gauge = outbox_for(ws)
    writer = asyncio.create_task(outbox.run())
    outbox.open_context("c")
    outbox.queue_control("first")
    for _ in range(3):
        queue_audio(outbox, "c", b"pcm", 20.0)
    outbox.drop_audio("c")
    outbox.queue_control('{"type":"done"}')
    assert gauge == [0]
    ws.reading.set()
    await asyncio.wait_for(outbox.empty.wait(), 5)
    assert ws.sent == ["first", '{"type":"done"}']
    writer.cancel()


async def test_nothing_is_queued_after_close_and_counts_settle() -> None:
    ws = FakeSocket()
    outbox, gauge = outbox_for(ws)
    writer = asyncio.create_task(outbox.run())
    outbox.open_context("c")
    outbox.close(1001, "going away")
    outbox.queue_control("too late")
    queue_audio(outbox, "c", b"pcm", 20.0)
    await asyncio.wait_for(writer, 5)
    assert ws.sent == [] and ws.closed == (1001, "going away")
    assert gauge == [0] and outbox.pending_control == 0


async def test_a_vanished_client_ends_the_writer() -> None:
    class Gone(FakeSocket):
        async def send_text(self, text: str) -> None:
            raise OSError("connection reset")

    outbox, _ = outbox_for(Gone())
    writer = asyncio.create_task(outbox.run())
    outbox.queue_control("hello")
    await asyncio.wait_for(writer, 5)
    assert outbox.closed and outbox.pending_control == 0
