"""The command line, run as users run it."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from streamtts.models.fish.packed import packs

REPO_DIR = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamtts", *args],
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def read_wav(path: Path) -> tuple[int, np.ndarray]:
    with wave.open(str(path)) as wav:
        assert wav.getnchannels() == 1 and wav.getsampwidth() == 2
        rate = wav.getframerate()
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2") / 32768
    return rate, samples


def test_say_writes_speech_with_the_bundled_voice(tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    result = run_cli("say", "Hello there, this is the bundled voice speaking.", "-o", str(out))
    assert result.returncode == 0, result.stderr
    rate, samples = read_wav(out)
    assert rate == 22050
    assert 1.5 < samples.size / rate < 8
    assert float(np.sqrt(np.mean(samples**2))) > 0.02
    assert "wrote" in result.stderr


def test_say_with_the_synthetic_fish_model(tmp_path: Path) -> None:
    out = tmp_path / "noise.wav"
    result = run_cli("say", "three short words", "-o", str(out), "--model", "synthetic:tiny")
    assert result.returncode == 0, result.stderr
    rate, samples = read_wav(out)
    assert rate == 44100
    assert samples.size == 3 * 9 * 2048


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["say", "x", "-o", "/tmp/x.wav", "--model", "nonsense"], "unknown model"),
        (["serve", "--port", "99999"], "port must be"),
        (["serve", "--ssl-certfile", "/nonexistent.pem"], "TLS needs both"),
        (
            ["serve", "--ssl-certfile", "/nonexistent.pem", "--ssl-keyfile", "/nonexistent.key"],
            "TLS file not found: /nonexistent.pem",
        ),
        (["say", "x", "-o", "/tmp/x.wav", "--speed", "9"], "must satisfy 0.25 ≤ speed ≤ 4"),
        (["bench", "--fidelity", "--profile", "--batches", "2"], "--batches, --profile: not for"),
        (["bench", "--fidelity", "--dtype", "int8"], "--dtype: not for --fidelity"),
        (["bench", "--steps", "12"], "--steps is an option of --fidelity"),
        (
            ["say", "x", "-o", "/tmp/x.wav", "--speed", "2", "--model", "synthetic:tiny"],
            "'speed' is not supported by the fish engine",
        ),
    ],
)
def test_bad_arguments_fail_clearly(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode != 0
    assert message in result.stderr


def test_bench_reports_every_stage_as_json() -> None:
    result = run_cli(
        "bench", "--model", "synthetic:tiny", "--dtype", "fp32", "--repeats", "2", "--json",
        "--profile",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    import json

    figures = json.loads(result.stdout)
    for key in (
        "model", "dtype", "device", "frames_per_s", "ttfa_ms_p50", "vocoder_rtf",
        "roofline_fraction", "peak_rss_mb", "prefill_64_ms", "prefill_256_ms",
        "slow_step_ms_b1", "fast_ms_b16", "memory_bandwidth_gb_s",
        "slow_step_ms_b1_long_context", "vocoder_ms_per_frame", "engine_ms_per_frame", "overlap",
        "ttfa_steps", "codebook_pass_roofline_fraction", "slow_step_roofline_fraction",
    ):  # fmt: skip
        assert key in figures, key
    assert figures["model"] == "synthetic:tiny" and figures["dtype"] == "float32"
    # Explicit fp32 (the parity mode) packs nothing: the fused ops do not apply.
    unfused = "python (the gate and up projections are not fused)"
    assert figures["codebook_pass"] == figures["slow_step"] == unfused
    assert figures["fast_products"] == figures["slow_products"] == "aten"
    assert figures["vocoder_convs"] == "aten"
    assert figures["frames_per_s"] > 0 and figures["roofline_fraction"] > 0
    assert figures["codebook_pass_roofline_fraction"] > 0
    assert figures["slow_step_roofline_fraction"] > 0
    assert figures["roofline_rounds"] == 5  # each fraction the median of 5 paired rounds
    for key in (
        "roofline_fraction",
        "slow_step_roofline_fraction",
        "codebook_pass_roofline_fraction",
    ):
        low, high = figures[f"{key}_range"]
        assert 0 < low <= figures[key] <= high
    assert profile_bandwidth_is_its_own(figures["codebook_pass_profile"])
    assert figures["ttfa_steps"] == round(figures["ttfa_ms_p50"] / figures["step_ms_b1"], 2)
    low, high = figures["ttfa_steps_paired_range"]  # each first audio over a step after it
    assert 0 < low <= figures["ttfa_steps_paired"] <= high
    assert figures["overlap"] > 0
    huge_pages_mb = figures["huge_pages_mb"]  # none of the tiny model's tensors reach 2 MiB
    assert huge_pages_mb is None or huge_pages_mb >= 0
    profile = figures["codebook_pass_profile"]  # --profile: the codebook pass op by op
    names = [op["op"] for op in profile["ops"]]
    assert any(name in ("aten::linear", "aten::addmm", "aten::mm") for name in names), names
    assert all(op["self_ms"] > 0 and op["calls"] > 0 for op in profile["ops"])
    assert sum(op["self_ms"] for op in profile["ops"]) <= profile["ops_self_ms"] + 0.01
    assert 0 < profile["matrix_products_ms"] <= profile["ops_self_ms"]
    bytes_per_ms = figures["codebook_pass_weight_bytes"] / profile["matrix_products_ms"]
    assert profile["matrix_products_gb_s"] == pytest.approx(bytes_per_ms / 1e6, abs=0.06)
    assert profile["matrix_products_bandwidth_fraction"] > 0
    assert "codebook pass, op by op" in result.stderr
    assert "ERROR" not in result.stderr  # the profiler's backend started on the main thread
    assert "prefill 64 tokens" in result.stderr  # progress while it runs


def profile_bandwidth_is_its_own(profile: dict[str, float]) -> bool:
    """The op profile's products are set against a bandwidth measured right before them."""
    rate = profile["matrix_products_gb_s"] / profile["memory_bandwidth_gb_s"]
    return bool(profile["matrix_products_bandwidth_fraction"] == pytest.approx(rate, abs=0.01))


@pytest.mark.skipif(
    not packs(torch.device("cpu"), torch.bfloat16),
    reason="this CPU has no native bf16: nothing packs (and bf16 runs emulated, slowly)",
)
def test_bench_counts_packed_bf16_weights() -> None:
    """bf16 layers are packed into oneDNN's layout on the CPU; the roofline still counts them."""
    import json

    bench = ["bench", "--model", "synthetic:tiny", "--repeats", "1", "--batches", "1", "--json"]
    runs = {
        dtype: json.loads(run_cli(*bench, "--dtype", dtype).stdout) for dtype in ("fp32", "bf16")
    }
    assert runs["bf16"]["dtype"] == "bfloat16"
    fp32_bytes = runs["fp32"]["weight_bytes_per_step"]
    assert runs["bf16"]["weight_bytes_per_step"] * 2 == fp32_bytes


def test_bench_fidelity_compares_bf16_and_int8_with_fp32() -> None:
    """On the upstream-format fixture checkpoint: both precisions stay close to fp32 by every
    figure, and int8 is further from it than bf16 (it is the coarser of the two); ``auto``,
    where it is packed fp32, is closer still."""
    import json

    from tests.fish_fixture import fixture_dir

    result = run_cli("bench", "--fidelity", "--model", str(fixture_dir()), "--steps", "12")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert 1 <= report["frames"] <= 12
    for precision in ("bf16", "int8"):
        for head in ("slow", "codebooks"):
            figures = report[precision][head]
            assert 0 < figures["rel_rms"] < 0.05 and figures["max_abs"] > 0
            assert 0.8 <= figures["top1"] <= 1 and 0.9 <= figures["top_p_overlap"] <= 1
        agreement = report[precision]["greedy_agreement"]
        assert 0 <= agreement["prefix"] <= agreement["all"] <= 1
    assert report["int8"]["slow"]["rel_rms"] > report["bf16"]["slow"]["rel_rms"]
    auto = report["auto"]  # the engine's default here: bf16, or fp32 with packed weights
    assert auto["dtype"] in ("bfloat16", "float32") and report["bf16"]["dtype"] == "bfloat16"
    if auto["dtype"] == "float32":  # fp32 roundings only: far closer than bf16
        assert auto["packed"]
        for head in ("slow", "codebooks"):
            assert auto[head]["rel_rms"] < report["bf16"][head]["rel_rms"] / 10
