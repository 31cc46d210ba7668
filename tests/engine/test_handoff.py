"""The hand-off from worker threads to the streaming coroutine."""

from __future__ import annotations

import threading

import numpy as np

from streamtts.engine.base import StreamStats
from streamtts.engine.handoff import PcmHandoff


async def test_posted_chunks_come_in_order_until_the_end() -> None:
    handoff = PcmHandoff()
    stats = StreamStats()

    def work() -> None:
        for size in (3, 5):
            handoff.post(np.ones(size, np.float32))
        handoff.end()

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert [pcm.size async for pcm in handoff.chunks(stats, "test")] == [3, 5]
    assert stats.audio_samples == 8


async def test_a_stop_drops_what_was_posted_before_it() -> None:
    handoff = PcmHandoff()
    stats = StreamStats()
    handoff.post(np.ones(3, np.float32))
    received = []
    async for pcm in handoff.chunks(stats, "test"):
        received.append(pcm.size)
        handoff.post(np.ones(5, np.float32))  # made while the consumer held the first
        handoff.end()
        handoff.stop()
    assert received == [3]
    assert stats.audio_samples == 3  # the dropped chunk is not counted as streamed
