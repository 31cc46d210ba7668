"""The load-test client's bookkeeping, and one bounded run against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.__main__ import percentile
from loadtest.clients import PlaybackClock
from tests.servers import ServerProcess

REPO_DIR = Path(__file__).resolve().parents[2]


def test_playback_clock_counts_a_gap_as_one_underrun() -> None:
    clock = PlaybackClock()
    clock.on_audio(10.0, 1.0)  # 1 s of audio at t=10: playback starts
    clock.on_audio(10.5, 1.0)  # on time: 0.5 s still buffered
    assert clock.underruns == 0 and clock.min_lead_s == pytest.approx(0.5)
    clock.on_audio(12.5, 1.0)  # the 2 s ran out at t=12: half a second of silence
    assert clock.underruns == 1
    assert clock.paused_s == pytest.approx(0.5)
    clock.on_audio(12.6, 1.0)  # playback resumed at 12.5: 0.9 s ahead now
    assert clock.underruns == 1
    assert clock.received_s == pytest.approx(4.0)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0


@pytest.mark.timeout(600)
def test_a_bounded_run_against_a_live_server(live_fish_server: str, tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "lt.json", tmp_path / "lt.png"
    result = subprocess.run(
        [sys.executable, "-m", "loadtest", "--url", live_fish_server, "--levels", "1", "2",
         "--utterances", "1", "--cadence-ms", "5", "--json", str(out_json), "--png", str(out_png)],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=480,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(out_json.read_text())["levels"]
    assert [r["clients"] for r in rows] == [1, 2]
    assert all(r["errors"] == 0 and r["utterances"] == r["clients"] for r in rows)
    assert all(r["ttfa_ms_p50"] is not None and r["audio_s"] > 0 for r in rows)
    assert out_png.stat().st_size > 10_000
    assert "TTFA p50" in result.stdout


@pytest.mark.timeout(600)
def test_find_capacity_ramps_until_refusals_and_counts_them_apart(tmp_path: Path) -> None:
    """A server capped at two active contexts: the ramp meets refusals above two, counts them
    as refusals (not errors) and reports at most two streams served cleanly."""
    server = ServerProcess(env={"STREAMTTS_MAX_ACTIVE_CONTEXTS": "2"})
    try:
        server.wait_ready()
        out_json = tmp_path / "capacity.json"
        result = subprocess.run(
            [sys.executable, "-m", "loadtest", "--url", server.url, "--find-capacity",
             "--max-clients", "8", "--cadence-ms", "5", "10", "--json", str(out_json),
             "--png", ""],
            cwd=REPO_DIR, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    report = json.loads(out_json.read_text())
    rows = {r["clients"]: r for r in report["levels"]}
    assert 4 in rows and rows[4]["refused"] >= 2 and rows[4]["errors"] == 0
    assert rows[4]["refusal_ms_max"] is not None
    assert 1 <= report["capacity_streams"] <= 2
    assert f"capacity: {report['capacity_streams']} concurrent streams" in result.stderr


def test_refuses_non_loopback_targets() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loadtest", "--url", "http://192.0.2.1:8000"],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "loopback" in result.stderr


def test_first_audio_measures_ttfa_and_concurrency(live_server: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.first_audio", "--url", live_server, "--runs", "2",
         "--streams", "2"],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert len(figures["ttfa_ms_runs"]) == 2 and figures["ttfa_ms_p50"] > 0
    assert len(figures["barge_in_bytes_after_cancel_runs"]) == 2
    assert figures["barge_in_bytes_after_cancel_p50"] >= 0 and figures["barge_in_done_ms_p50"] > 0
    assert len(figures["concurrent_streams"]) == 2
    assert all(s["audio_s"] > 1 and s["ratio"] > 0 for s in figures["concurrent_streams"])
    assert "run 2/2" in result.stderr  # progress while it runs


def test_engine_bench_reports_ttfa_and_concurrency(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.engine_bench", "--model", "synthetic:tiny", "--dtype",
         "fp32", "--runs", "2", "--streams", "1", "2", "--reference-s", "3", "--hint-ms",
         "40", "--json", str(out)],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["model"] == "synthetic:tiny" and figures["dtype"] == "float32"
    assert [c["streams"] for c in figures["concurrency"]] == [1, 2]
    assert all(c["worst_rtf"] > 0 for c in figures["concurrency"])
    cloned = figures["cloned_voice"]
    assert cloned["reference_s"] == 3 and cloned["reference_frames"] == 65
    assert cloned["ttfa_ms_first_use"] > 0 and cloned["later_over_default"] > 0
    hinted = figures["hinted"]
    assert hinted["hint_ms"] == 40 and hinted["ttfa_ms_hinted_p50"] > 0
    assert hinted["ttfa_ms_unhinted_p50"] > 0 and "paired_difference_ms_p50" in hinted
    assert "hinted" in result.stderr


def test_an_empty_png_path_skips_the_chart(live_fish_server: str, tmp_path: Path) -> None:
    """The GPU check runs without matplotlib: ``--png ""`` writes the JSON only."""
    out_json = tmp_path / "lt.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtest", "--url", live_fish_server, "--levels", "1",
         "--utterances", "1", "--cadence-ms", "5", "--json", str(out_json), "--png", ""],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO_DIR)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(out_json.read_text())["levels"][0]["errors"] == 0
    assert list(tmp_path.iterdir()) == [out_json]
    assert f"wrote {out_json}\n" in result.stderr


def test_first_audio_through_the_compatibility_clients() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.compat_first_audio", "--spawn", "--runs", "1"],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    clients = [k for k in figures if k not in ("sentence", "runs")]
    assert clients == [
        "wyoming_plain",
        "wyoming_streaming",
        "fish_legacy_http",
        "fish_new_http",
        "fish_legacy_live",
        "fish_new_live",
    ]
    assert all(figures[c]["first_audio_ms_p50"] > 0 for c in clients)


def test_piper_stages_compares_the_decoders_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "stages.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.piper_stages", "--rounds", "2", "--json", str(out)],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures == json.loads(result.stdout)
    assert figures["rounds"] == 2 and figures["audio_s_per_round"] > 10
    for key in ("front", "exported_whole", "blocked_whole", "exported_split", "blocked_split"):
        assert 0 < figures[f"{key}_s_per_audio_s"] < 1
    assert figures["exported_first_window_ms"] > 0 and figures["blocked_first_window_ms"] > 0
    # The ratios are the medians of the rounds' own ratios (no speed target in a test).
    assert figures["whole_ratio"] > 0 and figures["first_window_ratio"] > 0
    assert "round 2/2 (blocked first)" in result.stderr  # progress, alternating
