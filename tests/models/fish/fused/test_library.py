"""Building and loading the fused ops' library: kept under a key, and never half-written."""

from __future__ import annotations

import os
import shutil
import sysconfig
import time
from pathlib import Path

import pytest
import torch

from streamtts.models.fish.fused import library
from streamtts.models.fish.fused.library import FusedUnavailable


def test_the_library_is_kept_under_a_key_of_its_sources_flags_and_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    first = library.library_path()
    assert first.parent.parent == tmp_path and first.name == "streamtts_fused.so"
    flags = library.BUILD_FLAGS
    monkeypatch.setattr(library, "BUILD_FLAGS", ("-O3",))
    assert library.library_path() != first
    monkeypatch.setattr(library, "BUILD_FLAGS", flags)
    assert library.library_path() == first
    header = tmp_path / "packed_ops.h"
    header.write_text(library.HEADERS[0].read_text() + "// changed\n")
    with monkeypatch.context() as changed:
        changed.setattr(library, "HEADERS", (header,))
        assert library.library_path() != first
    assert library.library_path() == first
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert library.library_path() != first


def test_a_library_that_cannot_be_built_is_unavailable_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source the compiler rejects (as a missing compiler or ninja would fail): a clear
    reason, and nothing half-written where a later start would load it."""
    broken = tmp_path / "slow_step.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(library, "SOURCES", (library.SOURCES[0], broken))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    kept = library.library_path()
    assert kept.is_relative_to(tmp_path / "extensions")
    with pytest.raises(FusedUnavailable, match="building streamtts_fused failed"):
        library.load_library.__wrapped__()
    assert not kept.exists()


def test_a_build_removes_other_keys_libraries_unused_for_a_month_and_abandoned_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    kept = library.library_path()
    now_s = time.time()

    def made(relative: str, age_s: float, is_file: bool = True) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if is_file:
            path.write_bytes(b"so")
        else:
            path.mkdir()
        os.utime(path, (now_s - age_s, now_s - age_s))
        return path

    day_s = 24 * 3600.0
    made(str(kept.relative_to(tmp_path)), 90 * day_s)  # this key's own: never removed
    old = made("streamtts_fused-aaaa/streamtts_fused.so", 31 * day_s)
    recent = made("streamtts_fused-bbbb/streamtts_fused.so", 29 * day_s)
    crashed = made("streamtts_fused-cccc/build-123", 2 * 3600.0, is_file=False)
    building = made("streamtts_fused-dddd/build-456", 60.0, is_file=False)
    own_crashed = made(f"{kept.parent.name}/build-789", 2 * 3600.0, is_file=False)
    other_extension = made("another_ext-eeee/another_ext.so", 400 * day_s)
    removed = library.remove_stale(kept)
    assert set(removed) == {old.parent, crashed, crashed.parent, own_crashed}
    assert kept.exists() and recent.exists() and building.exists() and other_extension.exists()
    assert not old.parent.exists() and not crashed.parent.exists() and not own_crashed.exists()
    assert library.remove_stale(kept) == []  # nothing more, and no error


def test_loading_marks_the_library_used(tmp_path: Path) -> None:
    used = tmp_path / "streamtts_fused.so"
    used.write_bytes(b"so")
    os.utime(used, (0, 0))
    library._mark_used(used)
    assert time.time() - used.stat().st_mtime < 60
    library._mark_used(tmp_path / "missing.so")  # no error where it cannot be marked


def _folder_with_ninja(folder: Path) -> str:
    folder.mkdir()
    ninja = folder / "ninja"
    ninja.write_text("#!/bin/sh\n")
    ninja.chmod(0o755)
    return str(folder)


def test_a_build_finds_ninja_beside_the_interpreter_when_the_path_has_none(
    tmp_path: Path,
) -> None:
    scripts = _folder_with_ninja(tmp_path / "venv-bin")
    elsewhere = _folder_with_ninja(tmp_path / "usr-bin")
    plain = tmp_path / "plain"
    plain.mkdir()
    without = str(plain)
    assert library.build_search_path(without, scripts) == os.pathsep.join((without, scripts))
    assert library.build_search_path(elsewhere, scripts) == elsewhere  # the PATH's goes first
    assert library.build_search_path(without, without) == without  # nowhere to find one
    assert library.build_search_path("", scripts) == scripts


def test_the_fish_extra_puts_ninja_where_a_build_finds_it() -> None:
    """PyPI's ninja (a dependency of the fish extra) is in this interpreter's scripts folder,
    so a build finds it even from a PATH without any."""
    scripts = sysconfig.get_path("scripts")
    assert shutil.which("ninja", path=library.build_search_path("", scripts)) is not None


def test_a_build_restores_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.setenv("PATH", str(plain))
    scripts = _folder_with_ninja(tmp_path / "venv-bin")
    monkeypatch.setattr(sysconfig, "get_path", lambda name: scripts)
    with library._ninja_on_path():
        assert shutil.which("ninja") == str(Path(scripts) / "ninja")
    assert os.environ["PATH"] == str(plain)
