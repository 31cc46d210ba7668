"""The reference fixture set ships with the repository, unedited, and every case is collected."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from tests.fish_fixture import DEFAULT_FIXTURE, ENV_VAR, REPO_ROOT, Index, entries

CHECKSUMS = REPO_ROOT / "tests" / "fixtures" / "fish15-tiny.sha256"


def test_the_default_set_lies_inside_the_repository() -> None:
    """CI has ``../shared`` beside its clone, so only this notices a default pointing out."""
    assert DEFAULT_FIXTURE.resolve().is_relative_to(REPO_ROOT.resolve())
    assert (DEFAULT_FIXTURE / "expected" / "index.json").is_file()
    assert (REPO_ROOT / "pyproject.toml").is_file()  # REPO_ROOT really is the checkout


def test_the_bundled_set_is_unedited() -> None:
    listed = {}
    for line in CHECKSUMS.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.removeprefix("./")] = digest
    on_disk = {
        str(path.relative_to(DEFAULT_FIXTURE)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(DEFAULT_FIXTURE.rglob("*"))
        if path.is_file()
    }
    assert on_disk == listed


def test_every_listed_file_exists(fish_fixture_dir: Path, fish_index: Index) -> None:
    missing = [n for n in fish_index["files"] if not (fish_fixture_dir / "expected" / n).is_file()]
    assert not missing, f"index.json lists files the set lacks: {missing}"


def test_entries_fail_loudly_without_a_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with monkeypatch.context() as patched:
        patched.setenv(ENV_VAR, str(tmp_path / "nowhere"))
        (only,) = entries(r"gen_\w+_y\.npy")
        assert only.startswith("<missing")  # a placeholder that fails in require_dir
    names = entries(r"gen_(\w+?)_fp32_y\.npy")
    assert names and all(re.fullmatch(r"gen_\w+?_fp32_y\.npy", n) for n in names)
    (none,) = entries(r"no_such_case_\w+\.npy")
    assert none.startswith("<no file matching")
