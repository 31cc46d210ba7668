"""Running the real clients: what a stuck one reports."""

from __future__ import annotations

import socket

import pytest

from loadtest.compat import ClientError, run_client


async def test_a_client_that_times_out_reports_where_it_was_stuck() -> None:
    # A server that takes connections and never answers: the client waits in its TLS
    # handshake (for its 10 s open timeout), far beyond the 3 s given here.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        with pytest.raises(ClientError) as failure:
            await run_client(
                "elevenlabs_sdk", ["--base-url", f"https://127.0.0.1:{port}"], timeout_s=3
            )
    message = str(failure.value)
    assert "client elevenlabs_sdk timed out after 3 s" in message
    assert "most recent call first" in message  # the stacks faulthandler printed
    assert "elevenlabs_sdk.py" in message  # down to the client's own frame
