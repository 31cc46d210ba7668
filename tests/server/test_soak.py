"""A bounded soak on loopback against the Fish engine (``synthetic:tiny``, so KV slots are real):
hundreds of contexts opened, ended, cancelled, abandoned and disconnected at random. Afterwards
nothing has leaked (contexts, KV slots, queued audio, sockets — read from /metrics), resident
memory is within 5% of its level after warm-up, and a normal request gets correct audio.

Count-based: a fixed number of admitted contexts per client, whatever the machine's speed; the
time bound only turns a hang into a failure."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from streamtts.server.metrics import parse_exposition
from tests.servers import ServerProcess
from tests.ws_client import StreamClient

SAMPLES_PER_WORD = 9 * 2048  # synthetic:tiny speaks 9 frames of 2048 samples per word
MAX_STREAMS = 4
# Chunks of 9 frames = one word of synthetic:tiny, and segments cut at 7 words: every vocoder
# call has one of a few shapes (batch size x chunk length), so the native caches keyed by shape
# (oneDNN's primitive cache) fill during the warm-up instead of growing through the soak.
CHUNK_FRAMES = 9
MAX_FRAMES = 7 * CHUNK_FRAMES
CLIENTS = 5  # more than the KV slots: some starts are refused with `overloaded`
# Warm-up runs in rounds until resident memory settles (at most WARM_UP_MAX_ROUNDS). What grows
# during it is bounded native memory: oneDNN's primitive cache, one entry per tensor shape seen
# (batch size x chunk length), measured with tracemalloc (the Python heap stays flat) and
# ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 (then native memory in use stays flat too).
WARM_UP_ROUND_CONTEXTS = 60  # admitted contexts per round, all clients together
WARM_UP_SETTLED = 0.01  # rounds that grow RSS by less than this...
WARM_UP_SETTLED_ROUNDS = 2  # ...this many times in a row end the warm-up
WARM_UP_MAX_ROUNDS = 6
SOAK_CONTEXTS = 150  # admitted contexts, all clients together
REFUSAL_BACKOFF_S = 0.02  # a refused client waits this long before its next start
HANG_BOUND_S = 400.0  # a phase that takes longer than this has hung (2-core CI: ~1 min)
RSS_TOLERANCE = 0.05
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def metrics(url: str) -> dict[str, float]:
    return parse_exposition(httpx.get(url + "/metrics", timeout=10).text)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--model",
        "synthetic:tiny",
        env={
            "STREAMTTS_DTYPE": "fp32",
            "STREAMTTS_MAX_STREAMS": str(MAX_STREAMS),
            "STREAMTTS_FIRST_CHUNK_FRAMES": str(CHUNK_FRAMES),
            "STREAMTTS_CHUNK_FRAMES": str(CHUNK_FRAMES),
            "STREAMTTS_MAX_FRAMES_PER_SEGMENT": str(MAX_FRAMES),
        },
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) + "."


async def one_context(client: StreamClient, context: str, rng: random.Random) -> str:
    """Run one context with a random fate; returns the fate (or what the server said)."""
    await client.send(type="start", context=context)
    first = await client.until(lambda m: m.get("context") == context, timeout_s=30)
    if first["type"] == "error":
        assert first["code"] == "overloaded", first
        return "refused"
    fate = rng.choice(["end", "end", "cancel", "cancel_at_once", "abandon", "drop"])
    for _ in range(rng.randint(1, 3)):
        await client.send(type="text", context=context, text=sentence(rng) + " ")
    if fate == "end":
        await client.send(type="end", context=context)
        done = await client.until(
            lambda m: m["type"] == "done" and m.get("context") == context, timeout_s=60
        )
        assert done["reason"] == "end", done
    elif fate.startswith("cancel"):
        await client.send(type="flush", context=context)
        if fate == "cancel":
            await asyncio.sleep(rng.uniform(0.0, 0.3))
        await client.send(type="cancel", context=context)
        done = await client.until(
            lambda m: m["type"] == "done" and m.get("context") == context, timeout_s=30
        )
        assert done["reason"] == "cancel", done
    else:
        await client.send(type="flush", context=context)
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        if fate == "abandon":
            await client.ws.close()  # a clean close in mid-stream
        else:
            client.ws.transport.abort()  # the connection just drops
    return fate


async def client_loop(url: str, seed: int, admitted: int, fates: Counter[str]) -> None:
    """Run contexts until ``admitted`` of them were let in (refusals back off and retry)."""
    rng = random.Random(seed)
    client: StreamClient | None = None
    n = done = 0
    while done < admitted:
        if client is None:
            client = await StreamClient.open(url)
        fate = await one_context(client, f"c{seed}-{n}", rng)
        fates[fate] += 1
        n += 1
        if fate == "refused":
            await asyncio.sleep(REFUSAL_BACKOFF_S)
            continue
        done += 1
        if fate in ("abandon", "drop") or rng.random() < 0.1:
            if fate not in ("abandon", "drop"):
                await client.close()
            client = None
    if client is not None:
        await client.close()


async def run_phase(server: ServerProcess, admitted: int, seed: int) -> Counter[str]:
    """``admitted`` contexts in all (rounded up to a multiple of the clients)."""
    fates: Counter[str] = Counter()
    per_client = -(-admitted // CLIENTS)
    clients = (
        client_loop(server.ws_url, seed * 1000 + i, per_client, fates) for i in range(CLIENTS)
    )
    await asyncio.wait_for(asyncio.gather(*clients), HANG_BOUND_S)
    return fates


async def full_load(server: ServerProcess, repeats: int = 3) -> None:
    """Every KV slot busy with the longest texts the soak uses, all at once: the engine's
    largest working set (batch size, chunk sizes), so its allocator grows to it now rather
    than at some random moment of the soak."""
    longest = " ".join([" ".join(WORDS[:6]) + "."] * 3)

    async def speak(i: int) -> None:
        client = await StreamClient.open(server.ws_url)
        for n in range(repeats):
            await client.send(type="start", context=f"w{i}-{n}")
            await client.send(type="text", context=f"w{i}-{n}", text=longest)
            await client.send(type="end", context=f"w{i}-{n}")
            result = await client.until_done(f"w{i}-{n}")
            assert result.done is not None and result.done["reason"] == "end"
        await client.close()

    await asyncio.gather(*(speak(i) for i in range(MAX_STREAMS)))


async def settled(server: ServerProcess, timeout_s: float = 15.0) -> dict[str, float]:
    """Metrics once every context, socket and slot has been given back."""
    deadline = time.monotonic() + timeout_s
    while True:
        figures = metrics(server.url)
        idle = (
            figures["streamtts_active_contexts"] == 0
            and figures["streamtts_open_sockets"] == 0
            and figures["streamtts_output_buffer_bytes"] == 0
            and figures["streamtts_engine_free_slots"] == figures["streamtts_engine_capacity"]
        )
        if idle or time.monotonic() > deadline:
            return figures
        await asyncio.sleep(0.2)


@pytest.mark.timeout(3 * HANG_BOUND_S)
async def test_soak_leaves_no_leaks(server: ServerProcess) -> None:
    pid = server.proc.pid
    began = time.monotonic()
    warm: Counter[str] = Counter()
    await full_load(server)
    rss_before = rss_kib(pid)
    calm_rounds = 0
    for round_ in range(1, WARM_UP_MAX_ROUNDS + 1):
        warm += await run_phase(server, WARM_UP_ROUND_CONTEXTS, seed=round_)
        await settled(server)
        rss_previous, rss_before = rss_before, rss_kib(pid)
        calm = rss_before - rss_previous < WARM_UP_SETTLED * rss_previous
        calm_rounds = calm_rounds + 1 if calm else 0
        if calm_rounds >= WARM_UP_SETTLED_ROUNDS:
            break
    soak = await run_phase(server, SOAK_CONTEXTS, seed=0)
    after = await settled(server)
    rss_after = rss_kib(pid)
    elapsed_s = time.monotonic() - began

    contexts = sum(soak.values())
    admitted = contexts - soak["refused"]
    print(
        f"\nsoak: {contexts} contexts ({admitted} admitted) after {sum(warm.values())} "
        f"warm-up in {elapsed_s:.1f} s ({dict(soak)}); RSS {rss_before} KiB after warm-up -> "
        f"{rss_after} KiB ({100 * (rss_after - rss_before) / rss_before:+.2f}%)"
    )
    assert admitted == CLIENTS * -(-SOAK_CONTEXTS // CLIENTS), soak
    for fate in ("end", "cancel", "cancel_at_once", "abandon", "drop"):
        assert soak[fate] > 0, soak
    assert after["streamtts_active_contexts"] == 0
    assert after["streamtts_open_sockets"] == 0
    assert after["streamtts_output_buffer_bytes"] == 0
    assert after["streamtts_engine_free_slots"] == after["streamtts_engine_capacity"] == MAX_STREAMS
    ended = {
        name: value for name, value in after.items() if name.startswith("streamtts_contexts_total{")
    }
    assert ended.get('streamtts_contexts_total{reason="disconnect"}', 0) > 0
    assert abs(rss_after - rss_before) <= RSS_TOLERANCE * rss_before

    # And it still speaks correctly.
    client = await StreamClient.open(server.ws_url)
    result = await client.speak("final", "one two three four five.", "pcm_s16le", 44100)
    await client.close()
    assert result.done is not None and result.done["reason"] == "end"
    assert len(result.audio) == 5 * SAMPLES_PER_WORD * 2
    assert server.proc.poll() is None
