"""Shared fixtures: real uvicorn servers on 127.0.0.1 (the bundled Piper voice, synthetic Fish),
the Fish reference fixture set (see tests/fish_fixture.py), one torch thread per module."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.fish_fixture import Index, fixture_dir, load_index, require_dir

REPO_DIR = Path(__file__).resolve().parents[1]
SERVER_START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """``streamtts serve`` in a child process; stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"streamtts-{self.port}.log"
        self._log = self.log_path.open("wb")
        cmd = [sys.executable, "-m", "streamtts", "serve", "--host", "127.0.0.1"]
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(self.port), *args],
            cwd=REPO_DIR,
            env={**os.environ, **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready in {timeout_s} s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


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
