"""Pytest fixtures for the Fish-Speech tests: the reference fixture set (see tests/fish_fixture.py).

``fish_fixture_dir`` defaults to the set in this repository (``tests/fixtures/fish15-tiny``);
``STREAMTTS_FISH_FIXTURE`` points it at another set of the same format. A missing set fails the
tests (never skips).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.fish_fixture import Index, fixture_dir, load_index, require_dir


@pytest.fixture(scope="session")
def fish_fixture_dir() -> Path:
    return require_dir(fixture_dir())


@pytest.fixture(scope="session")
def fish_index(fish_fixture_dir: Path) -> Index:
    return load_index(fish_fixture_dir)


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """One intra-op thread for a module: the tiny fixture model's ops are too small to gain from
    threads, and on a shared CPU OpenMP spin-waiting makes 2 threads several times slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
