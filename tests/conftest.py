"""Shared fixtures: real uvicorn servers on 127.0.0.1 (the bundled Piper voice, synthetic Fish),
the Fish reference fixture set (see tests/fish_fixture.py), one torch thread per module.

The session's servers and engines keep what they cache (a Piper voice's calibration) in a
folder of the test session, never the user's: the first start calibrates, later ones read it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.fish_fixture import Index, fixture_dir, load_index, require_dir
from tests.servers import ServerProcess

_CACHE_HOME = "XDG_CACHE_HOME"
_saved_cache_home = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_saved_cache_home] = os.environ.get(_CACHE_HOME)
    os.environ[_CACHE_HOME] = tempfile.mkdtemp(prefix="streamtts-test-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ[_CACHE_HOME], ignore_errors=True)
    saved = config.stash.get(_saved_cache_home, None)
    if saved is None:
        os.environ.pop(_CACHE_HOME, None)
    else:
        os.environ[_CACHE_HOME] = saved


@pytest.fixture(scope="session")
def live_fish_server() -> Iterator[str]:
    """Base URL of a real server running the Fish engine on ``synthetic:tiny`` (noise)."""
    server = ServerProcess("--model", "synthetic:tiny", env={"STREAMTTS_DTYPE": "fp32"})
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def live_server() -> Iterator[str]:
    """Base URL of a real server with the bundled voice, shared by the whole test session."""
    server = ServerProcess()
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop()


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
