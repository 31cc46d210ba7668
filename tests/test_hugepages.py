"""Transparent huge pages for torch's tensors: the command line's default, and torch using them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamtts import hugepages
from streamtts.cli import main

# A process that imports torch and fills a 64 MiB tensor, then prints its huge-page MB.
ALLOCATE = (
    "import torch; from streamtts.hugepages import huge_pages_mb; "
    "t = torch.ones(16 << 20); print(huge_pages_mb())"
)


def test_the_default_is_on_and_an_explicit_setting_wins() -> None:
    unset: dict[str, str] = {}
    hugepages.default_on(unset)
    assert unset == {hugepages.THP_ENV: "1"}
    off = {hugepages.THP_ENV: "0"}
    hugepages.default_on(off)
    assert off == {hugepages.THP_ENV: "0"}


def test_the_command_line_sets_the_default_before_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(hugepages.THP_ENV, "unset below")  # so the test's end restores it
    monkeypatch.delenv(hugepages.THP_ENV)
    with pytest.raises(SystemExit):  # --help: the parser exits before any command runs
        main(["--help"])
    assert os.environ[hugepages.THP_ENV] == "1"


def test_the_command_line_module_does_not_import_torch() -> None:
    """torch reads the variable once, at its first allocation: main() must run before it."""
    probe = "import sys, streamtts.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def huge_mb_after_allocating(setting: str) -> float:
    env = {**os.environ, hugepages.THP_ENV: setting}
    out = subprocess.run(
        [sys.executable, "-c", ALLOCATE], capture_output=True, text=True, check=True, env=env
    )
    return float(out.stdout.strip())


@pytest.mark.skipif(
    hugepages.kernel_mode() != "madvise", reason="needs the kernel's THP mode to be madvise"
)
def test_torch_puts_large_tensors_on_huge_pages_only_when_told() -> None:
    assert huge_mb_after_allocating("1") >= 32  # most of the 64 MiB tensor
    assert huge_mb_after_allocating("0") == 0


def test_the_kernel_mode_and_the_process_figure_are_read_from_their_files(tmp_path: Path) -> None:
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    assert hugepages.kernel_mode(mode) == "madvise"
    assert hugepages.kernel_mode(tmp_path / "absent") is None
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text("Rss:  2062668 kB\nAnonHugePages:   1110016 kB\nShmemHugePages: 0 kB\n")
    assert hugepages.huge_pages_mb(rollup) == 1110016 / 1024
    assert hugepages.huge_pages_mb(tmp_path / "absent") is None


def test_the_start_log_line_says_what_torch_was_told_and_what_the_kernel_allows(
    tmp_path: Path,
) -> None:
    mode = tmp_path / "enabled"
    mode.write_text("always madvise [never]\n")
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text("AnonHugePages:   2048 kB\n")
    told = {hugepages.THP_ENV: "1"}
    assert hugepages.summary(told, mode, rollup) == (
        "huge pages: 2 MB of the process (THP_MEM_ALLOC_ENABLE=1, kernel THP mode never)"
    )
    absent = tmp_path / "absent"
    assert hugepages.summary({}, absent, absent) == (
        "huge pages: unknown of the process (THP_MEM_ALLOC_ENABLE=unset, kernel THP mode unknown)"
    )
