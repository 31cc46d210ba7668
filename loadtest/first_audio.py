"""Time to first audio and concurrent real-time delivery over the native WebSocket.

    python -m loadtest.first_audio [--url http://127.0.0.1:8000] [--spawn] [--runs 10]

1. TTFA and barge-in: for each run, open a context, send a 12-word sentence as ``text`` +
   ``flush`` and time the first audio byte at the client; then ``cancel`` at once (on that first
   frame) and count the context's audio that still arrives and how long ``done`` takes. Prints
   every run and the medians.
2. Concurrency: N contexts (default 4) on separate sockets speak a paragraph at once; for each,
   audio seconds received divided by wall seconds from ``text`` to ``done``. The server paces
   each context to at most ``max_send_ahead_ms`` ahead of real-time playback, so a stream that
   keeps up shows a ratio just above 1 (the engines' own speed: ``loadtest.engine_bench``).

``--spawn`` starts ``streamtts serve`` on a free loopback port for the measurement. Only
loopback addresses are accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import orjson
from websockets.asyncio.client import connect

from loadtest.spawn import add_target_arguments, target_server

SENTENCE_12_WORDS = "The quick brown fox jumps over the lazy dog near the river bank."
PARAGRAPH = (
    "Streaming speech lets a voice assistant answer while it is still thinking. "
    "Each sentence is spoken as soon as it is complete, so the listener hears the first words "
    "almost at once. Several listeners can be served at the same time on one machine."
)
SAMPLE_RATE_HZ = 24_000
BYTES_PER_SAMPLE = 2
TIMEOUT_S = 120.0


async def first_audio_ms(ws_url: str, context: str) -> tuple[float, int, float]:
    """(ms to the first audio, audio bytes of the context received after the ``cancel`` sent on
    that first frame, ms from the ``cancel`` to its ``done``)."""
    async with connect(ws_url, max_size=None) as ws:
        await ws.send(orjson.dumps({"type": "start", "context": context}).decode())
        await ws.recv()  # started
        sent_s = time.perf_counter()
        await ws.send(
            orjson.dumps({"type": "text", "context": context, "text": SENTENCE_12_WORDS}).decode()
        )
        await ws.send(orjson.dumps({"type": "flush", "context": context}).decode())
        while True:
            frame = await asyncio.wait_for(ws.recv(), TIMEOUT_S)
            if isinstance(frame, bytes):
                elapsed_ms = 1000.0 * (time.perf_counter() - sent_s)
                break
        await ws.send(orjson.dumps({"type": "cancel", "context": context}).decode())
        cancelled_s = time.perf_counter()
        after_cancel_bytes = 0
        while True:
            frame = await asyncio.wait_for(ws.recv(), TIMEOUT_S)
            if isinstance(frame, bytes):
                after_cancel_bytes += len(frame) - 1 - frame[0]
            elif orjson.loads(frame)["type"] == "done":
                done_ms = 1000.0 * (time.perf_counter() - cancelled_s)
                return elapsed_ms, after_cancel_bytes, done_ms


async def realtime_ratio(ws_url: str, context: str) -> dict[str, float]:
    """Audio seconds delivered per wall second, from sending the text to ``done``."""
    async with connect(ws_url, max_size=None) as ws:
        await ws.send(orjson.dumps({"type": "start", "context": context}).decode())
        await ws.recv()
        sent_s = time.perf_counter()
        await ws.send(
            orjson.dumps({"type": "text", "context": context, "text": PARAGRAPH}).decode()
        )
        await ws.send(orjson.dumps({"type": "end", "context": context}).decode())
        audio_bytes = 0
        first_s = None
        while True:
            frame = await asyncio.wait_for(ws.recv(), TIMEOUT_S)
            if isinstance(frame, bytes):
                first_s = first_s or time.perf_counter()
                audio_bytes += len(frame) - 1 - frame[0]
            elif orjson.loads(frame)["type"] == "done":
                break
        wall_s = time.perf_counter() - sent_s
        audio_s = audio_bytes / BYTES_PER_SAMPLE / SAMPLE_RATE_HZ
        return {
            "audio_s": round(audio_s, 2),
            "wall_s": round(wall_s, 2),
            "ratio": round(audio_s / wall_s, 2),
            "first_audio_ms": round(1000 * ((first_s or sent_s) - sent_s), 1),
        }


async def measure(url: str, runs: int, streams: int) -> dict[str, object]:
    ws_url = url.replace("http://", "ws://").rstrip("/") + "/v1/stream"
    await first_audio_ms(ws_url, "warm-up")
    ttfa: list[float] = []
    after_cancel: list[int] = []
    done_after_cancel: list[float] = []
    for i in range(runs):
        ttfa_ms, after_bytes, done_ms = await first_audio_ms(ws_url, f"ttfa-{i}")
        ttfa.append(ttfa_ms)
        after_cancel.append(after_bytes)
        done_after_cancel.append(done_ms)
        print(
            f"  run {i + 1}/{runs}: first audio after {ttfa_ms:.1f} ms; cancel on it: "
            f"{after_bytes} bytes ({after_bytes / BYTES_PER_SAMPLE / SAMPLE_RATE_HZ * 1000:.0f} ms)"
            f" still arrived, done {done_ms:.1f} ms later",
            file=sys.stderr,
        )
    print(f"  {streams} concurrent streams...", file=sys.stderr)
    concurrent = await asyncio.gather(*(realtime_ratio(ws_url, f"rt-{i}") for i in range(streams)))
    return {
        "ttfa_ms_runs": [round(t, 1) for t in ttfa],
        "ttfa_ms_p50": round(statistics.median(ttfa), 1),
        "barge_in_bytes_after_cancel_runs": after_cancel,
        "barge_in_bytes_after_cancel_p50": statistics.median(after_cancel),
        "barge_in_done_ms_p50": round(statistics.median(done_after_cancel), 1),
        "concurrent_streams": concurrent,
        "min_realtime_ratio": min(c["ratio"] for c in concurrent),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_target_arguments(parser)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--streams", type=int, default=4)
    args = parser.parse_args(argv)
    with target_server(args, parser) as url:
        result = asyncio.run(measure(url, args.runs, args.streams))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
