"""Benchmark the Fish-Speech 1.5 text-to-semantic model at full size (synthetic:1.5 weights).

Measures, with medians over several runs:
  * load time and peak resident memory of loading a bf16 ``model.pth`` (fresh subprocess each);
  * decode steps per second (one slow step + the 8-position fast pass + sampling) at batch 1
    and batch 8, bf16, at a KV length of about ``--kv-len``.

Usage: .venv/bin/python scripts/bench_fish_llm.py [--threads 2] [--runs 3] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from streamtts.models.fish.llm.checkpoint import MODEL_FILE, load_fish_llm
from streamtts.models.fish.llm.generate import RepetitionWindows, decode_step, prefill_frame
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams
from streamtts.models.fish.llm.synthetic import write_synthetic_checkpoint

_LOAD_CHILD = """
import json, sys, time, torch
from streamtts.models.fish.llm.checkpoint import load_fish_llm
def hwm_kb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
torch.set_num_threads(int(sys.argv[2]))
base = hwm_kb()
t0 = time.perf_counter()
llm = load_fish_llm(sys.argv[1], torch.bfloat16)
load_s = time.perf_counter() - t0
sum(float(p.sum()) for p in llm.model.parameters())
ready_s = time.perf_counter() - t0
print(json.dumps({"base_kb": base, "peak_kb": hwm_kb(), "load_s": load_s, "ready_s": ready_s}))
"""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def bench_load(directory: Path, runs: int, threads: int) -> dict[str, float]:
    reports = []
    for run in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", _LOAD_CHILD, str(directory), str(threads)],
            capture_output=True,
            text=True,
            check=True,
        )
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        log(f"load run {run + 1}/{runs}: {reports[-1]}")
    file_mb = (directory / MODEL_FILE).stat().st_size / 2**20
    return {
        "file_mb": file_mb,
        "load_s_median": statistics.median(r["load_s"] for r in reports),
        "load_and_touch_s_median": statistics.median(r["ready_s"] for r in reports),
        "peak_rss_mb_median": statistics.median(r["peak_kb"] for r in reports) / 1024,
        "baseline_rss_mb_median": statistics.median(r["base_kb"] for r in reports) / 1024,
    }


@torch.no_grad()
def bench_decode(
    directory: Path, batch_sizes: list[int], kv_len: int, steps: int, runs: int
) -> dict[str, float]:
    llm = load_fish_llm(directory, torch.bfloat16)
    model = llm.model
    max_batch = max(batch_sizes)
    cache = model.allocate_cache(max_batch, kv_len + steps * (runs + 1) + 16)
    rows = model.config.num_codebooks + 1
    sampling_one = BatchSampling.from_params([SamplingParams()])
    prompt = torch.randint(0, 1000, (rows, kv_len), dtype=torch.int32)
    log(f"prefill {kv_len} tokens into slot 0 ...")
    t0 = time.perf_counter()
    first = prefill_frame(model, cache, prompt, 0, sampling_one)
    log(f"prefill took {time.perf_counter() - t0:.2f} s")
    for slot in range(1, max_batch):
        cache.copy_prefix(0, slot, kv_len)
    results: dict[str, float] = {}
    for batch in batch_sizes:
        slots = torch.arange(batch)
        sampling = BatchSampling.from_params([SamplingParams()] * batch)
        windows = RepetitionWindows(cache.slots, rows)
        frames = first[None].repeat(batch, 1)
        position = kv_len
        rates = []
        for run in range(runs + 1):  # the first run is a warm-up
            t0 = time.perf_counter()
            for step in range(steps):
                positions = torch.full((batch,), position)
                frames = decode_step(
                    model,
                    cache,
                    frames,
                    slots,
                    positions,
                    position + 1,
                    windows,
                    torch.full((batch,), step),
                    sampling,
                )
                position += 1
            rate = steps / (time.perf_counter() - t0)
            log(f"batch {batch} run {run}{' (warm-up)' if run == 0 else ''}: {rate:.2f} steps/s")
            if run:
                rates.append(rate)
            position -= steps  # rewind: keep the KV length near kv_len
        results[f"steps_per_s_batch{batch}"] = statistics.median(rates)
        results[f"frames_per_s_batch{batch}"] = statistics.median(rates) * batch
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kv-len", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None, help="reuse a written synthetic:1.5 dir")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or Path(tmp) / "synthetic-1.5"
        if not (directory / MODEL_FILE).is_file():
            log(f"writing synthetic:1.5 (bf16) to {directory} ...")
            write_synthetic_checkpoint(directory, "1.5", torch.bfloat16)
        log("measuring load ...")
        report = bench_load(directory, args.runs, args.threads)
        log("measuring decode ...")
        report |= bench_decode(directory, [1, 8], args.kv_len, args.steps, args.runs)
    report |= {"threads": args.threads, "kv_len": args.kv_len, "torch": torch.__version__}  # type: ignore[dict-item]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
