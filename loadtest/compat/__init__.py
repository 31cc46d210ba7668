"""The real third-party clients (the ElevenLabs SDK, Pipecat, LiveKit, the Cartesia SDK) driven
against a streamtts server, unmodified, each in a subprocess of their own virtual environment.

The clients pin libraries the server also uses at other versions (Pipecat: ``soxr~=1.0.0``,
``soundfile~=0.13.1``, ``protobuf<7``), so they live in ``.venv-clients`` (made by
``scripts/install-clients`` from the ``clients`` list in pyproject.toml), never next to the
server. Each script (``python -m loadtest.compat.<name>``) imports only its client and the
standard library and prints one JSON object per line: ``{"t": <time.monotonic()>, "event": ...}``
(the same clock as the server's on this machine), ending with ``{"event": "result", ...}``.

This module is standard library only: the scripts import it from the clients' environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parents[2]
CLIENTS_VENV = REPO_DIR / ".venv-clients"
CLIENTS_PYTHON = CLIENTS_VENV / "bin" / "python"
# LLM-like text: tokens that carry their own spaces, several sentences.
ANSWER = (
    "Sure, here is the plan for today. First we check the weather, then we pack a small bag. "
    "After lunch we walk down to the harbour and watch the boats come in."
)


def emit(event: str, **fields: Any) -> None:
    """One event line on stdout, stamped with the monotonic clock."""
    print(json.dumps({"t": time.monotonic(), "event": event, **fields}), flush=True)


def tokens(text: str) -> list[str]:
    """``text`` cut the way LLMs stream it: each word with its leading space."""
    words = text.split(" ")
    return [words[0], *(" " + w for w in words[1:])]


class ClientError(RuntimeError):
    """A client script failed; the message holds its output."""


def require_clients() -> Path:
    if not CLIENTS_PYTHON.exists():
        raise ClientError(
            f"{CLIENTS_PYTHON} is missing: run scripts/install-clients (scripts/test does)"
        )
    return CLIENTS_PYTHON


def _parse(stdout: str, stderr: str, returncode: int, name: str) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if returncode != 0 or not events or events[-1]["event"] != "result":
        raise ClientError(
            f"client {name} exited with {returncode}\n--- stdout\n{stdout[-4000:]}"
            f"\n--- stderr\n{stderr[-8000:]}"
        )
    return events


async def run_client(
    name: str, args: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 120.0
) -> list[dict[str, Any]]:
    """Run ``loadtest.compat.<name>`` in the clients' environment (without blocking the event
    loop, which may be serving the server it talks to); its events."""
    proc = await asyncio.create_subprocess_exec(
        str(require_clients()),
        "-X",
        "faulthandler",  # SIGABRT prints every thread's stack: where a stuck client is
        "-m",
        f"loadtest.compat.{name}",
        *args,
        cwd=REPO_DIR,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    # Read in tasks of their own, so that what was read before a timeout is kept.
    out_read = asyncio.create_task(proc.stdout.read())
    err_read = asyncio.create_task(proc.stderr.read())
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        proc.send_signal(signal.SIGABRT)  # its stacks, then it ends
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        out, err = await out_read, await err_read
        # Its events so far and its stacks say where it stopped (a client that reads until the
        # server closes the socket waits forever for a close that never comes).
        raise ClientError(
            f"client {name} timed out after {timeout_s:.0f} s\n--- stdout\n"
            f"{out.decode()[-4000:]}\n--- stderr\n{err.decode()[-8000:]}"
        ) from None
    out, err = await out_read, await err_read
    assert proc.returncode is not None
    return _parse(out.decode(), err.decode(), proc.returncode, name)


def run_client_sync(
    name: str, args: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 120.0
) -> list[dict[str, Any]]:
    """:func:`run_client` for callers without an event loop (the benchmark)."""
    done = subprocess.run(
        [str(require_clients()), "-m", f"loadtest.compat.{name}", *args],
        cwd=REPO_DIR,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return _parse(done.stdout, done.stderr, done.returncode, name)
