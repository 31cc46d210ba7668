"""Start ``streamtts serve`` on a free loopback port for a measurement, and stop it after."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

READY_TIMEOUT_S = 120.0


class SpawnedServer:
    def __init__(self, model: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamtts", "serve", "--port", str(port), "--model", model,
             "--log-level", "warning"],
        )  # fmt: skip
        print(f"  starting server ({model}) on {self.url}...", file=sys.stderr)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited during start-up")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError("the server did not become ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
