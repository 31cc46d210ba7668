"""Fish engine figures, in process (no HTTP): time to first audio and concurrency.

    python -m loadtest.engine_bench [--model synthetic:1.5] [--dtype auto] [--runs 10]
                                    [--streams 1 2 4] [--hint-ms 45] [--json out.json]

1. TTFA: a 60-character sentence, median of ``--runs`` (time from ``synthesize`` to the first
   PCM chunk; the stream is then cancelled).
2. Real-time factor at 1, 2, 4... concurrent streams, each speaking a two-sentence paragraph:
   per stream, wall seconds from submit to the last PCM divided by audio seconds (< 1 = faster
   than real time); the worst stream is reported.
3. With ``--reference-s 10``: TTFA of a voice cloned from 10 s of reference — its first use
   (which prefills the reference), later uses (which copy its kept prefix) and the default
   voice, alternating, medians of ``--runs``.
4. With ``--hint-ms 45``: TTFA of the same sentence when the engine was told it was likely next
   (``EngineStream.prepare``, as the server does once a sentence's end arrives) that long
   before it came (the next LLM token, which confirms the end), alternating with unhinted
   runs, medians of ``--runs``.
(How the generator and the vocoder overlap is in ``streamtts bench``: ``overlap``.) Uses the
engine's public API only.

Runs on CPU or CUDA with the same code path (``--device``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from loadtest import print_result
from streamtts.engine.base import ClonedVoice, SynthesisOptions
from streamtts.fish.engine import FishEngine
from streamtts.fish.settings import FishSettings

SENTENCE_60_CHARS = "The weather is lovely today, so let us walk down to the sea."
PARAGRAPH = (
    "Streaming speech lets an assistant answer while it is still thinking. "
    "Each sentence is spoken as soon as it is ready."
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def ttfa_ms(
    engine: FishEngine, voice: str | ClonedVoice = "default", hint_s: float | None = None
) -> float:
    """From ``synthesize`` to the first PCM chunk; with ``hint_s``, the sentence was hinted
    (``prepare``) that many seconds before."""
    stream = engine.open_stream(voice, SynthesisOptions())
    if hint_s is not None:
        stream.prepare(SENTENCE_60_CHARS)
        await asyncio.sleep(hint_s)
    started_s = time.perf_counter()
    try:
        async for _ in stream.synthesize(SENTENCE_60_CHARS):
            return 1000.0 * (time.perf_counter() - started_s)
    finally:
        stream.close()
    raise RuntimeError("no audio")


async def one_stream_rtf(engine: FishEngine) -> dict[str, float]:
    stream = engine.open_stream("default", SynthesisOptions())
    started_s = time.perf_counter()
    samples = 0
    first_s = None
    try:
        for sentence in PARAGRAPH.split(". "):
            async for pcm in stream.synthesize(sentence):
                first_s = first_s or time.perf_counter()
                samples += pcm.size
    finally:
        stream.close()
    wall_s = time.perf_counter() - started_s
    audio_s = samples / engine.sample_rate
    return {
        "rtf": wall_s / audio_s,
        "ttfa_ms": 1000 * ((first_s or started_s) - started_s),
        "audio_s": audio_s,
    }


async def concurrency(engine: FishEngine, streams: int) -> dict[str, Any]:
    results = await asyncio.gather(*(one_stream_rtf(engine) for _ in range(streams)))
    return {
        "streams": streams,
        "worst_rtf": round(max(r["rtf"] for r in results), 3),
        "median_rtf": round(statistics.median(r["rtf"] for r in results), 3),
        "ttfa_ms_p50": round(statistics.median(r["ttfa_ms"] for r in results), 1),
    }


def reference_audio(seconds: float, rate_hz: int = 44_100) -> npt.NDArray[np.float32]:
    """A voiced-like test signal (a gliding harmonic tone with a syllable-rate envelope); the
    synthetic model's codes of it cost what a real recording's do."""
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    pitch = 120 + 30 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate_hz
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    return (0.2 * voiced * envelope).astype(np.float32)


Timed = tuple[str, Callable[[], Awaitable[float]]]  # (its name in the log, a timing in ms)


async def alternated(a: Timed, b: Timed, runs: int) -> tuple[list[float], list[float]]:
    """``runs`` pairs of timings, each pair back to back so that both see the same machine."""
    a_ms: list[float] = []
    b_ms: list[float] = []
    for i in range(runs):
        a_ms.append(await a[1]())
        b_ms.append(await b[1]())
        log(f"  run {i + 1}/{runs}: {a[0]} {a_ms[-1]:.0f} ms, {b[0]} {b_ms[-1]:.0f} ms")
    return a_ms, b_ms


async def cloned_voice_ttfa(engine: FishEngine, reference_s: float, runs: int) -> dict[str, Any]:
    """TTFA of a voice cloned from ``reference_s`` seconds: its first use (which prefills the
    reference), later uses (which copy the kept prefix), and the default voice, in one run."""
    started_s = time.perf_counter()
    codes = await engine.encode_reference(reference_audio(reference_s), 44_100)
    encode_s = time.perf_counter() - started_s
    voice = ClonedVoice(
        "bench", "This is the reference transcript, read slowly and clearly.", codes
    )
    log(f"  cloned voice: {codes.shape[1]} frames from {reference_s:g} s in {encode_s:.1f} s")
    first = await ttfa_ms(engine, voice)
    later, default = await alternated(
        ("cloned", lambda: ttfa_ms(engine, voice)), ("default", lambda: ttfa_ms(engine)), runs
    )
    later_p50, default_p50 = statistics.median(later), statistics.median(default)
    return {
        "reference_s": reference_s,
        "reference_frames": int(codes.shape[1]),
        "encode_s": round(encode_s, 2),
        "ttfa_ms_first_use": round(first, 1),
        "ttfa_ms_later_p50": round(later_p50, 1),
        "ttfa_ms_default_p50": round(default_p50, 1),
        "later_over_default": round(later_p50 / default_p50, 3),
    }


async def hinted_ttfa(engine: FishEngine, hint_ms: float, runs: int) -> dict[str, Any]:
    hinted, unhinted = await alternated(
        ("hinted", lambda: ttfa_ms(engine, hint_s=hint_ms / 1000)),
        ("unhinted", lambda: ttfa_ms(engine)),
        runs,
    )
    hinted_p50, unhinted_p50 = statistics.median(hinted), statistics.median(unhinted)
    return {
        "hint_ms": hint_ms,
        "ttfa_ms_hinted_p50": round(hinted_p50, 1),
        "ttfa_ms_unhinted_p50": round(unhinted_p50, 1),
        "hinted_over_unhinted": round(hinted_p50 / unhinted_p50, 3),
        # Each pair ran back to back: their differences cancel the machine's drift.
        "paired_difference_ms_p50": round(
            statistics.median(h - u for h, u in zip(hinted, unhinted, strict=True)), 1
        ),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = FishSettings(
        device=args.device, dtype=args.dtype, max_streams=max(args.streams), compile=args.compile
    )
    engine = FishEngine(args.model, settings)
    log(f"loading {args.model} ...")
    started_s = time.perf_counter()
    await engine.start()
    info = engine.describe()
    result: dict[str, Any] = {
        "model": args.model,
        "device": info["device"],
        "dtype": info["dtype"],
        "load_and_warm_up_s": round(time.perf_counter() - started_s, 1),
        "torch_threads": torch.get_num_threads(),
        "compile_s": {name: round(t, 1) for name, t in info["compile_s"].items()},
    }
    log(f"loaded in {result['load_and_warm_up_s']} s; TTFA x{args.runs}")
    ttfa = []
    for i in range(args.runs):
        ttfa.append(await ttfa_ms(engine))
        log(f"  ttfa run {i + 1}/{args.runs}: {ttfa[-1]:.0f} ms")
    result["ttfa_ms_runs"] = [round(t, 1) for t in ttfa]
    result["ttfa_ms_p50"] = round(statistics.median(ttfa), 1)
    if args.reference_s > 0:
        result["cloned_voice"] = await cloned_voice_ttfa(engine, args.reference_s, args.runs)
    if args.hint_ms > 0:
        log(f"  first audio with the sentence hinted {args.hint_ms:g} ms before it comes")
        result["hinted"] = await hinted_ttfa(engine, args.hint_ms, args.runs)
    result["concurrency"] = []
    for n in args.streams:
        log(f"  {n} concurrent stream(s) ...")
        result["concurrency"].append(await concurrency(engine, n))
        log(f"    {result['concurrency'][-1]}")
    await engine.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="synthetic:1.5")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--compile", action="store_true", help="compile the decode step (see docs/operations.md)"
    )
    parser.add_argument(
        "--reference-s",
        type=float,
        default=0.0,
        help="also time a voice cloned from this many seconds of reference (first use, later "
        "uses, the default voice)",
    )
    parser.add_argument(
        "--hint-ms",
        type=float,
        default=0.0,
        help="also time first audio with the sentence hinted as likely next this many ms "
        "before it comes (alternating with unhinted runs)",
    )
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
