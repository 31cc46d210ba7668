"""One context's pipeline without a socket: segments in order, marks after their audio, the one
``done``, cancel, engine failures and slow consumers, with a fake engine stream."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from streamtts.options import SynthesisOptions
from streamtts.protocol import AudioFormat
from streamtts.server.context_runner import ContextRunner
from streamtts.server.metrics import Metrics
from streamtts.server.outbox import SlowConsumerError
from tests.fake_engine import FAIL, FakeEngine, FakeStream

RATE_HZ = 16_000


class Wire:
    """What the runner sends, in order: ("json", message) and ("audio", samples)."""

    def __init__(self, audio_limit_ms: float | None = None) -> None:
        self.events: list[tuple[str, Any]] = []
        self.finished: list[str] = []
        self.audio_limit_ms = audio_limit_ms
        self.audio_ms = 0.0
        self.sent: list[tuple[float, float]] = []  # (time.perf_counter(), ms) per audio frame

    async def send_json(self, message: dict[str, object]) -> None:
        self.events.append(("json", message))

    async def send_audio(self, context: str, payload: bytes, ms: float) -> None:
        self.audio_ms += ms
        if self.audio_limit_ms is not None and self.audio_ms > self.audio_limit_ms:
            raise SlowConsumerError("too much audio waiting")
        self.events.append(("audio", len(payload) // 2))
        self.sent.append((time.perf_counter(), ms))

    def messages(self, kind: str) -> list[dict[str, Any]]:
        return [m for k, m in self.events if k == "json" and m["type"] == kind]

    def samples(self) -> int:
        return sum(n for k, n in self.events if k == "audio")


def runner_for(
    wire: Wire,
    engine: FakeEngine | None = None,
    metrics: Metrics | None = None,
    max_send_ahead_ms: float | None = None,
    beyond_capacity: bool = False,
) -> tuple[ContextRunner, FakeStream]:
    engine = engine or FakeEngine(rate_hz=RATE_HZ)
    stream = engine.open_stream("fake-voice", SynthesisOptions())
    assert isinstance(stream, FakeStream)
    runner = ContextRunner(
        "c",
        stream,
        AudioFormat("pcm_s16le", RATE_HZ),
        wire.send_json,
        wire.send_audio,
        wire.finished.append,
        metrics,
        max_send_ahead_ms=max_send_ahead_ms,
        beyond_capacity=beyond_capacity,
    )
    return runner, stream


async def wait_done(wire: Wire) -> dict[str, Any]:
    for _ in range(500):
        if wire.messages("done"):
            return wire.messages("done")[0]
        await asyncio.sleep(0.01)
    raise TimeoutError("no done")


async def test_segments_marks_and_end_come_in_order_with_stats() -> None:
    wire, metrics = Wire(), Metrics()
    runner, stream = runner_for(wire, metrics=metrics)
    runner.queue_segment("Hello there.")
    runner.queue_flush_mark()
    runner.queue_segment("Bye.")
    runner.queue_end()
    done = await wait_done(wire)
    kinds = [m["type"] if k == "json" else "audio" for k, m in wire.events]
    first_flushed = kinds.index("flushed")
    assert kinds[0] == "audio" and kinds.count("segment") == 2 and kinds[-1] == "done"
    assert kinds.index("segment") < first_flushed < kinds.index("segment", first_flushed)
    segments = wire.messages("segment")
    assert [s["text"] for s in segments] == ["Hello there.", "Bye."]
    assert segments[0]["end_ms"] == segments[1]["start_ms"] > 0
    assert done["reason"] == "end" and done["stats"]["ttfa_ms"] is not None
    assert done["stats"]["audio_ms"] == segments[1]["end_ms"]
    assert wire.samples() == len("Hello there.Bye.") * 160  # the resampler's tail included
    assert stream.closed and wire.finished == ["c"]
    assert metrics.value("streamtts_contexts_total", reason="end") == 1
    assert metrics.value("streamtts_ttfa_ms_count") == 1
    assert not runner.busy


async def test_a_likely_segment_is_prepared_only_while_its_listener_waits() -> None:
    wire = Wire()
    runner, stream = runner_for(wire, FakeEngine(rate_hz=RATE_HZ, chunk_delay_s=0.01))
    runner.prepare_segment("Hello there.")  # nothing queued: the engine may start on it
    runner.queue_segment("Hello there.")
    runner.prepare_segment("Bye now.")  # the first is being spoken: no hint
    runner.queue_segment("Bye now.")
    runner.queue_end()
    await wait_done(wire)
    assert stream.prepared == ["Hello there."]
    assert stream.segments == ["Hello there.", "Bye now."]
    runner.prepare_segment("Too late.")  # finished: nothing
    assert stream.prepared == ["Hello there."]


async def test_cancel_stops_the_engine_and_sends_one_done() -> None:
    engine = FakeEngine(rate_hz=RATE_HZ, chunk_delay_s=0.05)
    wire = Wire()
    runner, stream = runner_for(wire, engine)
    runner.queue_segment("A long sentence that would take a while to speak aloud.")
    while not wire.events:
        await asyncio.sleep(0.01)
    await runner.cancel()
    await runner.cancel()  # idempotent
    assert stream.cancelled.is_set() and stream.closed
    assert [m["reason"] for m in wire.messages("done")] == ["cancel"]
    sent = wire.samples()
    await asyncio.sleep(0.2)
    assert wire.samples() == sent  # nothing after the cancel
    assert set(wire.finished) == {"c"}  # reported finished (possibly more than once)


async def test_an_engine_failure_ends_the_context_with_an_error() -> None:
    wire, metrics = Wire(), Metrics()
    runner, stream = runner_for(wire, metrics=metrics)
    runner.queue_segment(f"this fails {FAIL}")
    runner.queue_end()
    done = await wait_done(wire)
    (error,) = wire.messages("error")
    assert error["code"] == "internal" and error["context"] == "c"
    assert done["reason"] == "error" and stream.closed
    assert metrics.value("streamtts_contexts_total", reason="error") == 1


async def test_a_slow_consumer_ends_only_with_its_error() -> None:
    wire = Wire(audio_limit_ms=50.0)
    runner, _ = runner_for(wire)
    runner.queue_segment("Plenty of audio for a small buffer.")
    done = await wait_done(wire)
    assert [e["code"] for e in wire.messages("error")] == ["slow_consumer"]
    assert done["reason"] == "error"


async def test_abandon_sends_nothing_and_closes_the_stream() -> None:
    engine = FakeEngine(rate_hz=RATE_HZ, chunk_delay_s=0.05)
    wire, metrics = Wire(), Metrics()
    runner, stream = runner_for(wire, engine, metrics)
    runner.queue_segment("Speaking to nobody for a while now.")
    await asyncio.sleep(0.06)
    await runner.abandon()
    assert stream.closed and wire.messages("done") == []
    assert metrics.value("streamtts_contexts_total", reason="disconnect") == 1


# ---- pacing ----


async def test_audio_goes_out_at_most_the_send_ahead_bound_before_its_playback() -> None:
    """1.5 s of audio that the engine makes at once leaves the runner paced: each frame only
    once the listener (playing from the first frame) is less than 300 ms from hearing it."""
    wire, metrics = Wire(), Metrics()
    runner, _ = runner_for(wire, metrics=metrics, max_send_ahead_ms=300)
    runner.queue_segment("x" * 150)  # 10 ms per character
    runner.queue_end()
    done = await wait_done(wire)
    assert done["reason"] == "end" and done["stats"]["audio_ms"] == pytest.approx(1500, abs=1)
    first_s = wire.sent[0][0]
    before_s = 0.0  # audio sent before this frame
    for sent_s, ms in wire.sent:
        heard_s = sent_s - first_s
        assert heard_s >= before_s - 0.3 - 0.005, (heard_s, before_s)  # never further ahead
        before_s += ms / 1000
    assert wire.sent[-1][0] - first_s >= 1.5 - 0.3 - 0.1 - 0.005  # the last frame is 100 ms
    assert metrics.value("streamtts_lead_ms_count") == len(wire.sent)
    assert metrics.value("streamtts_late_audio_total") == 0
    assert "beyond_capacity" not in done["stats"]


async def test_unpaced_audio_goes_out_as_it_is_made() -> None:
    wire = Wire()
    runner, _ = runner_for(wire)
    runner.queue_segment("x" * 150)
    runner.queue_end()
    await wait_done(wire)
    first_s = wire.sent[0][0]
    assert wire.sent[-1][0] - first_s < 1.0  # 1.5 s of audio, no waiting for its playback


async def test_a_cancel_while_held_back_drops_the_rest_at_once() -> None:
    wire = Wire()
    runner, stream = runner_for(wire, max_send_ahead_ms=200)
    runner.queue_segment("x" * 500)  # 5 s of audio, made at once
    while wire.audio_ms < 300:
        await asyncio.sleep(0.01)
    cancelled_s = time.perf_counter()
    await runner.cancel()
    assert time.perf_counter() - cancelled_s < 0.5
    assert [m["reason"] for m in wire.messages("done")] == ["cancel"]
    assert wire.audio_ms < 1000  # the rest never went out
    assert stream.closed


async def test_audio_that_comes_after_its_listener_ran_out_is_counted_late() -> None:
    """An engine slower than real time: 100 ms of audio every 250 ms."""
    engine = FakeEngine(rate_hz=RATE_HZ, chunk_delay_s=0.25)
    wire, metrics = Wire(), Metrics()
    runner, _ = runner_for(wire, engine, metrics, max_send_ahead_ms=1500)
    runner.queue_segment("x" * 40)  # 4 chunks
    runner.queue_end()
    await wait_done(wire)
    late = metrics.value("streamtts_late_audio_total")
    assert late == len(wire.sent) - 1 == 3  # every frame after the first
    assert 3 * 0.1 < metrics.value("streamtts_late_audio_seconds_total") < 3 * 2.0


async def test_a_pause_for_more_text_is_not_late_audio() -> None:
    wire, metrics = Wire(), Metrics()
    runner, _ = runner_for(wire, metrics=metrics, max_send_ahead_ms=1500)
    runner.queue_segment("Hi.")  # 30 ms of audio
    while not wire.messages("segment"):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.15)  # the listener has heard it all: the next text comes later
    runner.queue_segment("And then more.")
    runner.queue_end()
    await wait_done(wire)
    assert metrics.value("streamtts_late_audio_total") == 0


async def test_a_stream_admitted_beyond_capacity_says_so() -> None:
    wire = Wire()
    runner, _ = runner_for(wire, beyond_capacity=True)
    runner.queue_segment("Hi.")
    runner.queue_end()
    assert (await wait_done(wire))["stats"]["beyond_capacity"] is True
