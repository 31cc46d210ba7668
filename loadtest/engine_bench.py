"""Fish engine figures, in process (no HTTP): time to first audio, concurrency, overlap.

    python -m loadtest.engine_bench [--model synthetic:1.5] [--dtype auto] [--runs 10]
                                    [--streams 1 2 4] [--json out.json]

1. TTFA: a 60-character sentence, median of ``--runs`` (time from ``synthesize`` to the first
   PCM chunk; the stream is then cancelled).
2. Real-time factor at 1, 2, 4... concurrent streams, each speaking a two-sentence paragraph:
   per stream, wall seconds from submit to the last PCM divided by audio seconds (< 1 = faster
   than real time); the worst stream is reported.
3. Overlap of generator and vocoder: wall time per frame for the generator alone (vocoder
   hand-off discarded), the vocoder alone (the same frames, decoded in the same chunks), and
   both together through the engine. On a GPU the two overlap on their own CUDA streams; on
   the CPU the vocoder runs inline on the generator thread, so "both" is about the sum.

Runs on CPU or CUDA with the same code path (``--device``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any, cast

import torch

from streamtts.engine.base import SynthesisOptions
from streamtts.fish.engine import FishEngine, FishSettings, FishStream, describe_dtype
from streamtts.fish.jobs import ChunkSchedule, SegmentJob

SENTENCE_60_CHARS = "The weather is lovely today, so let us walk down to the sea."
PARAGRAPH = (
    "Streaming speech lets an assistant answer while it is still thinking. "
    "Each sentence is spoken as soon as it is ready."
)
FRAME_S = 2048 / 44100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def ttfa_ms(engine: FishEngine) -> float:
    stream = engine.open_stream("default", SynthesisOptions())
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


def vocode_alone(
    engine: FishEngine, segment_frames: list[torch.Tensor], schedule: ChunkSchedule
) -> float:
    """Seconds to decode the vocoded frames as one stream in the engine's chunk sizes."""
    codes = torch.cat([f[1:, 1:] for f in segment_frames], dim=1)  # [C, N]
    decoder = engine.decoder
    state = decoder.new_state()
    started_s = time.perf_counter()
    with torch.inference_mode():
        position = 0
        while position < codes.shape[1]:
            size = schedule.first_frames if position == 0 else schedule.later_frames
            decoder.decode([state], [codes[:, position : position + size]])
            position += size
        if decoder.device.type == "cuda":
            torch.cuda.synchronize()
    return time.perf_counter() - started_s


async def overlap(engine: FishEngine, frames: int) -> dict[str, float]:
    """Wall ms per frame: generator alone, vocoder alone, both (the engine as it runs)."""
    text = " ".join(["word"] * (frames // 9))
    options = SynthesisOptions(max_frames_per_segment=frames + 1)

    # Both threads, as served.
    stream = engine.open_stream("default", options)
    assert isinstance(stream, FishStream)
    started_s = time.perf_counter()
    produced = 0
    async for pcm in stream.synthesize(text):
        produced += pcm.size // 2048
    both_s = time.perf_counter() - started_s
    segment_frames = stream.slot.history[1::2]  # [C+1, n] per segment, prefill frame first
    stream.close()

    # Generator alone: the vocoder hand-off is swallowed.
    generator = engine.generator
    slot = generator.acquire()
    assert slot is not None
    done = asyncio.get_running_loop().create_future()

    def on_codes(_: torch.Tensor, final: bool) -> None:
        if final:
            done.get_loop().call_soon_threadsafe(done.set_result, time.perf_counter())

    def on_error(exc: BaseException) -> None:
        done.get_loop().call_soon_threadsafe(done.set_exception, exc)

    job = SegmentJob(
        stream=slot,
        text=text,
        params=stream.params,
        max_frames=frames + 1,
        stop_on_im_end=False,
        schedule=stream.schedule,
        on_codes=on_codes,
        on_error=on_error,
    )
    started_s = time.perf_counter()
    generator.submit(job)
    generator_s = await done - started_s
    generator.release(slot)

    # Vocoder alone: the same frames in the same chunks, on the generator thread (the one
    # torch thread on a CPU; see streamtts.fish.devices).
    work = generator.call(lambda: vocode_alone(engine, segment_frames, stream.schedule))
    vocoder_s = cast(float, await asyncio.wrap_future(work))
    n = sum(f.shape[1] - 1 for f in segment_frames)
    return {
        "frames": n,
        "generator_alone_ms_per_frame": round(1000 * generator_s / n, 2),
        "vocoder_alone_ms_per_frame": round(1000 * vocoder_s / n, 2),
        "both_ms_per_frame": round(1000 * both_s / produced, 2),
        "sum_of_alone_ms_per_frame": round(1000 * (generator_s + vocoder_s) / n, 2),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = FishSettings(
        device=args.device, dtype=args.dtype, max_streams=max(args.streams), compile=args.compile
    )
    engine = FishEngine(args.model, settings)
    log(f"loading {args.model} ...")
    started_s = time.perf_counter()
    await engine.start()
    model = engine.generator.model
    result: dict[str, Any] = {
        "model": args.model,
        "device": str(model.device),
        "dtype": describe_dtype(model),
        "load_and_warm_up_s": round(time.perf_counter() - started_s, 1),
        "torch_threads": torch.get_num_threads(),
        "compile_s": {name: round(t, 1) for name, t in engine.generator.compile_s.items()},
    }
    log(f"loaded in {result['load_and_warm_up_s']} s; TTFA x{args.runs}")
    ttfa = []
    for i in range(args.runs):
        ttfa.append(await ttfa_ms(engine))
        log(f"  ttfa run {i + 1}/{args.runs}: {ttfa[-1]:.0f} ms")
    result["ttfa_ms_runs"] = [round(t, 1) for t in ttfa]
    result["ttfa_ms_p50"] = round(statistics.median(ttfa), 1)
    result["concurrency"] = []
    for n in args.streams:
        log(f"  {n} concurrent stream(s) ...")
        result["concurrency"].append(await concurrency(engine, n))
        log(f"    {result['concurrency'][-1]}")
    log(f"  overlap over {args.overlap_frames} frames ...")
    result["overlap"] = await overlap(engine, args.overlap_frames)
    log(f"    {result['overlap']}")
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
    parser.add_argument("--overlap-frames", type=int, default=90)
    parser.add_argument(
        "--compile", action="store_true", help="compile the decode step (see docs/operations.md)"
    )
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
