"""Firefly vocoder real-time factor at full size (released hyper-parameters, seeded weights).

Decodes one stream incrementally in chunks of 4, 8 and 16 frames, in fp32, bf16 (weights cast)
and bf16 (autocast, fp32 weights), and reports the median (and best) real-time factor (compute
seconds per second of audio; < 1 is faster than real time) over several runs, plus peak RSS. With
``--streams N`` N streams are decoded batched and the RTF is per second of all audio produced.

    .venv/bin/python scripts/bench_vocoder.py [--frames 48] [--runs 5] [--threads 2] [--streams 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

from streamtts.models.fish.codec.config import VocoderConfig
from streamtts.models.fish.codec.decoder import FireflyDecoder
from streamtts.models.fish.codec.incremental import IncrementalDecoder

SEED = 1234
MODES = {
    "fp32": (torch.float32, False),
    "bf16-cast": (torch.bfloat16, False),
    "bf16-autocast": (torch.bfloat16, True),
}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def build_decoder() -> FireflyDecoder:
    torch.manual_seed(SEED)
    decoder = FireflyDecoder(VocoderConfig())  # torch default init, seeded
    decoder.refresh()
    return decoder.eval().requires_grad_(False)


def time_stream(dec: IncrementalDecoder, codes: torch.Tensor, chunk: int, streams: int) -> float:
    """Seconds to decode ``codes`` [8, N] in chunks of ``chunk`` frames, for ``streams``
    streams batched together."""
    states = [dec.new_state() for _ in range(streams)]
    start = time.perf_counter()
    for i in range(0, codes.shape[1], chunk):
        dec.decode(states, [codes[:, i : i + chunk]] * streams)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=48, help="code frames per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--streams", type=int, default=1, help="streams batched per call")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    base = build_decoder()
    n_params = sum(p.numel() for p in base.parameters())
    print(
        f"decoder params: {n_params:,}; peak RSS after build {peak_rss_mib():.0f} MiB", flush=True
    )
    cfg = base.config
    codes = torch.randint(0, cfg.codebook_size, (cfg.quantizer.n_groups, args.frames))
    audio_s = args.frames * cfg.samples_per_code / cfg.sample_rate

    decoders = {
        mode: IncrementalDecoder(base, "cpu", MODES[mode][0], autocast=MODES[mode][1])
        for mode in args.modes
    }
    cases = [(mode, chunk) for mode in args.modes for chunk in args.chunks]
    for mode, chunk in cases:  # warm-up: oneDNN builds its kernels per shape on first use
        time_stream(decoders[mode], codes[:, : 2 * chunk], chunk, args.streams)
    print(f"peak RSS after building all modes and warm-up: {peak_rss_mib():.0f} MiB", flush=True)
    # Runs are interleaved across cases so that load from other processes on a shared machine
    # hits every case alike.
    rtfs: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    for run in range(args.runs):
        for mode, chunk in cases:
            seconds = time_stream(decoders[mode], codes, chunk, args.streams)
            rtf = seconds / (audio_s * args.streams)  # compute per second of audio produced
            rtfs[mode, chunk].append(rtf)
            print(
                f"  run {run + 1}/{args.runs}  {mode:14s} chunk {chunk:2d}  RTF {rtf:.3f}",
                flush=True,
            )
    results: dict[str, dict[str, dict[str, float]]] = {mode: {} for mode in args.modes}
    for (mode, chunk), values in rtfs.items():
        results[mode][f"chunk{chunk}"] = {
            "median_rtf": round(statistics.median(values), 4),
            "min_rtf": round(min(values), 4),
        }
    summary = {
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "threads": args.threads,
        "streams": args.streams,
        "frames_per_run": args.frames,
        "runs": args.runs,
        "rtf": results,
        "peak_rss_mib": round(peak_rss_mib()),
        "torch": torch.__version__,
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
