"""Start ``streamtts serve`` on a free loopback port for a measurement, and stop it after."""

from __future__ import annotations

import argparse
import contextlib
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

# A server with STREAMTTS_COMPILE compiles before it is ready: minutes on a small CPU at first.
READY_TIMEOUT_S = 900.0
PROGRESS_EVERY_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SpawnedServer:
    """``certfile``/``keyfile``: serve https:// and wss:// with that certificate (which must be
    its own authority, as ``loadtest.tls.self_signed`` makes it); ``extra_args`` go to
    ``streamtts serve``."""

    def __init__(
        self,
        model: str,
        certfile: Path | None = None,
        keyfile: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        port = free_port()
        tls: list[str] = []
        context: ssl.SSLContext | None = None
        if certfile is not None and keyfile is not None:
            tls = ["--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)]
            context = ssl.create_default_context(cafile=certfile)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamtts", "serve", "--port", str(port), "--model", model,
             "--log-level", "warning", *tls, *extra_args],
        )  # fmt: skip
        print(f"  starting server ({model}) on {self.url}...", file=sys.stderr)
        started = time.monotonic()
        deadline = started + READY_TIMEOUT_S
        next_progress = started + PROGRESS_EVERY_S
        while time.monotonic() < deadline:
            if time.monotonic() >= next_progress:
                waited_s = time.monotonic() - started
                print(f"  ... not ready after {waited_s:.0f} s (compiling?)", file=sys.stderr)
                next_progress += PROGRESS_EVERY_S
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited during start-up")
            try:
                with urllib.request.urlopen(
                    self.url + "/readyz", timeout=1, context=context
                ) as response:
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


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a loopback server")
    parser.add_argument("--spawn", action="store_true", help="start a server for the run")
    parser.add_argument("--model", default="piper", help="model for --spawn")


@contextlib.contextmanager
def target_server(
    args: argparse.Namespace, parser: argparse.ArgumentParser, extra_args: tuple[str, ...] = ()
) -> Iterator[str]:
    """The base URL to measure: ``--url`` (loopback only) or a server spawned for the run (with
    ``extra_args`` for ``streamtts serve``)."""
    if not args.spawn:
        host = urlparse(args.url).hostname or ""
        if not (host.startswith("127.") or host in ("localhost", "::1")):
            parser.error("only loopback servers may be measured")
        yield args.url
        return
    server = SpawnedServer(args.model, extra_args=extra_args)
    try:
        yield server.url
    finally:
        server.stop()
