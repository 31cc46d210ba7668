"""Real servers for the end-to-end tests: ``streamtts serve`` in a child process on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO_DIR = Path(__file__).resolve().parents[1]
SERVER_START_TIMEOUT_S = 90.0

# A send-ahead bound no test utterance reaches: audio goes out as it is made.
UNPACED_MS = 600_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """``streamtts serve`` in a child process; stopped (SIGTERM, then SIGKILL) on exit. With
    ``certfile`` (a PEM certificate that is its own authority, e.g. ``tests.tls.self_signed``)
    and ``keyfile`` it serves https:// and wss://."""

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        certfile: Path | None = None,
        keyfile: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.certfile = certfile
        secure = "s" if certfile is not None else ""
        self.url = f"http{secure}://127.0.0.1:{self.port}"
        self.ws_url = f"ws{secure}://127.0.0.1:{self.port}"
        if certfile is not None and keyfile is not None:
            args = (*args, "--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile))
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"streamtts-{self.port}.log"
        self._log = self.log_path.open("wb")
        cmd = [sys.executable, "-m", "streamtts", "serve", "--host", "127.0.0.1"]
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(self.port), *args],
            cwd=REPO_DIR,
            # Never the user's own data folder: a fresh one unless the test gives one.
            env={
                "STREAMTTS_DATA_DIR": tempfile.mkdtemp(prefix="streamtts-test-"),
                # Admission by measured capacity depends on the machine's speed, and pacing makes
                # every utterance take its real-time length: the tests of each switch it on
                # themselves (serve_app(paced=True), or their own STREAMTTS_MAX_SEND_AHEAD_MS).
                "STREAMTTS_ADMIT_BY_CAPACITY": "false",
                "STREAMTTS_MAX_SEND_AHEAD_MS": str(UNPACED_MS),
                **os.environ,
                **(env or {}),
            },
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def verify(self) -> ssl.SSLContext | bool:
        """What an httpx client needs to trust this server."""
        if self.certfile is None:
            return True
        return ssl.create_default_context(cafile=self.certfile)

    def wait_ready(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                response = httpx.get(self.url + "/readyz", timeout=1.0, verify=self.verify())
                if response.status_code == 200:
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
