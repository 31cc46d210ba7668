"""Firefly vocoder real-time factor at full size (released hyper-parameters, seeded weights).

Decodes one stream incrementally in chunks of 4, 8 and 16 frames, in fp32, bf16 (weights cast)
and bf16 (autocast, fp32 weights), and reports the median real-time factor (compute seconds per
second of audio; < 1 is faster than real time) over several runs, plus peak RSS.

    .venv/bin/python scripts/bench_vocoder.py [--frames 48] [--runs 5] [--threads 2]
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

from streamtts.models.fish.firefly_decoder import FireflyDecoder
from streamtts.models.fish.incremental import IncrementalDecoder
from streamtts.models.fish.vocoder_config import VocoderConfig

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


def time_stream(dec: IncrementalDecoder, codes: torch.Tensor, chunk: int) -> float:
    """Seconds to decode ``codes`` [8, N] as one stream in chunks of ``chunk`` frames."""
    state = dec.new_state()
    start = time.perf_counter()
    for i in range(0, codes.shape[1], chunk):
        dec.decode([state], [codes[:, i : i + chunk]])
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=48, help="code frames per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="+", default=[4, 8, 16])
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

    results: dict[str, dict[str, float]] = {}
    for mode in args.modes:
        dtype, autocast = MODES[mode]
        dec = IncrementalDecoder(base, "cpu", dtype, autocast=autocast)
        results[mode] = {}
        for chunk in args.chunks:
            time_stream(dec, codes[:, : 2 * chunk], chunk)  # warm-up
            rtfs = []
            for run in range(args.runs):
                rtfs.append(time_stream(dec, codes, chunk) / audio_s)
                print(
                    f"  {mode:14s} chunk {chunk:2d}  run {run + 1}/{args.runs}  RTF {rtfs[-1]:.3f}",
                    flush=True,
                )
            results[mode][f"chunk{chunk}"] = statistics.median(rtfs)
            print(
                f"{mode:14s} chunk {chunk:2d}: median RTF {results[mode][f'chunk{chunk}']:.3f}"
                f"  (peak RSS so far {peak_rss_mib():.0f} MiB)",
                flush=True,
            )
        del dec
    summary = {
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "threads": args.threads,
        "frames_per_run": args.frames,
        "runs": args.runs,
        "median_rtf": results,
        "peak_rss_mib": round(peak_rss_mib()),
        "torch": torch.__version__,
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
