"""Shared fixtures for the Fish-Speech tests.

``fish_fixture_dir``: the reference-checkpoint fixture set (tiny upstream-format checkpoints plus
upstream outputs in ``expected/``). Taken from ``STREAMTTS_FISH_FIXTURE``, default
``<repo>/../shared/fixtures/fish15-tiny``. A missing directory fails the tests (never skips).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_FIXTURE = REPO_ROOT.parent / "shared" / "fixtures" / "fish15-tiny"


def fixture_dir() -> Path:
    return Path(os.environ.get("STREAMTTS_FISH_FIXTURE", str(DEFAULT_FIXTURE)))


def load_index(directory: Path) -> dict[str, Any]:
    with open(directory / "expected" / "index.json", encoding="utf-8") as f:
        index: dict[str, Any] = json.load(f)
    return index


def index_entries(prefix: str, pattern: str | None = None) -> list[str]:
    """Names of ``expected/`` files starting with ``prefix`` (and matching ``pattern``).

    Used for parametrisation at collection time. Without an index it returns one placeholder,
    so the test runs and fails through :func:`fish_fixture_dir` instead of being skipped.
    """
    index_path = fixture_dir() / "expected" / "index.json"
    if not index_path.is_file():
        return [f"<missing {index_path}>"]
    names = sorted(name for name in load_index(fixture_dir())["files"] if name.startswith(prefix))
    return [n for n in names if pattern is None or re.fullmatch(pattern, n)]


@pytest.fixture(scope="session")
def fish_fixture_dir() -> Path:
    directory = fixture_dir()
    if not (directory / "expected" / "index.json").is_file():
        pytest.fail(f"Fish fixture set not found at {directory} (set STREAMTTS_FISH_FIXTURE)")
    return directory


@pytest.fixture(scope="session")
def fish_index(fish_fixture_dir: Path) -> dict[str, Any]:
    return load_index(fish_fixture_dir)
