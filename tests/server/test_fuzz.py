"""Fuzzing a live server: random JSON, random bytes, invalid UTF-8, oversized frames and random
message orders. The server must answer each bad frame with a documented error, never crash,
and serve a normal request afterwards.

Each fuzz frame is followed by a probe (``flush`` of an unknown context, which always yields
one ``unknown_context`` error naming the probe): everything that arrives before the probe's
answer is the server's answer to the fuzz frame.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from streamtts.protocol import ErrorCode, split_audio_frame
from streamtts.server.metrics import parse_exposition
from tests.servers import ServerProcess
from tests.strategies import JSON_VALUES, near_native_messages

MAX_MESSAGE_BYTES = 4096  # small, so oversized frames are cheap to make
DOC = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
DOCUMENTED_CODES = {c.value for c in ErrorCode if f"`{c.value}`" in DOC}
SERVER_TYPES = {"started", "segment", "flushed", "done", "error"}
RECV_TIMEOUT_S = 30.0
_probe_ids = itertools.count()


class Fuzzer:
    """One live socket, reopened when the server closes it (as it may for some frames)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.ws: ClientConnection | None = None
        self.closes: list[int] = []
        self._stack = contextlib.ExitStack()

    def socket(self) -> ClientConnection:
        if self.ws is None:
            url = self.server.ws_url + "/v1/stream"
            self.ws = self._stack.enter_context(connect(url, max_size=None, open_timeout=20))
        return self.ws

    def exchange(self, frame: str | bytes, *, text: bool | None = None) -> list[dict[str, Any]]:
        """Send a frame and then a probe; the messages answering the frame (audio skipped).
        An empty list with a new entry in ``closes`` means the server closed the socket."""
        ws = self.socket()
        probe = f"__probe_{next(_probe_ids)}"
        replies: list[dict[str, Any]] = []
        try:
            ws.send(frame, text=text)
            ws.send(orjson.dumps({"type": "flush", "context": probe}).decode())
            while True:
                raw = ws.recv(timeout=RECV_TIMEOUT_S)
                if isinstance(raw, bytes):
                    split_audio_frame(raw)  # well-formed audio frames only
                    continue
                message = orjson.loads(raw)
                if message.get("context") == probe:
                    assert message["type"] == "error" and message["code"] == "unknown_context"
                    return replies
                replies.append(message)
        except ConnectionClosed as exc:
            assert exc.rcvd is not None, "the server dropped the socket without a close frame"
            self.closes.append(exc.rcvd.code)
            self.ws = None
            return []

    def close(self) -> None:
        self._stack.close()


def as_text(message: dict[str, Any]) -> str:
    return orjson.dumps(message).decode()


def check_replies(replies: list[dict[str, Any]]) -> None:
    for message in replies:
        assert message["type"] in SERVER_TYPES, message
        if message["type"] == "error":
            assert message["code"] in DOCUMENTED_CODES, message
            assert isinstance(message["message"], str) and message["message"]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        env={
            "STREAMTTS_MAX_WS_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
            "STREAMTTS_MAX_TEXT_PER_MESSAGE_CHARS": "500",
            "STREAMTTS_MAX_CONTEXTS_PER_SOCKET": "3",
        }
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def fuzzer(server: ServerProcess) -> Iterator[Fuzzer]:
    fuzz = Fuzzer(server)
    yield fuzz
    fuzz.close()


def assert_still_serving(server: ServerProcess) -> None:
    assert server.proc.poll() is None, "the server died"
    assert httpx.get(server.url + "/readyz", timeout=5).status_code == 200
    with connect(server.ws_url + "/v1/stream", max_size=None) as ws:
        ws.send(orjson.dumps({"type": "start", "context": "ok"}).decode())
        ws.send(orjson.dumps({"type": "text", "context": "ok", "text": "Still fine."}).decode())
        ws.send(orjson.dumps({"type": "end", "context": "ok"}).decode())
        audio = 0
        while True:
            raw = ws.recv(timeout=RECV_TIMEOUT_S)
            if isinstance(raw, bytes):
                audio += len(split_audio_frame(raw)[1])
                continue
            message = orjson.loads(raw)
            if message["type"] == "done":
                assert message["reason"] == "end"
                break
    assert audio > 10_000


FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NEAR_MESSAGES = near_native_messages(
    st.sampled_from(["f1", "f2", ""]), st.sampled_from(["default", "nobody"])
)


@settings(FUZZ, max_examples=150)
@given(st.one_of(JSON_VALUES, NEAR_MESSAGES))
def test_random_json(fuzzer: Fuzzer, value: object) -> None:
    replies = fuzzer.exchange(json.dumps(value))
    check_replies(replies)
    # Whatever it started, stop it so contexts do not pile up across examples.
    for context in {m["context"] for m in replies if m["type"] == "started"}:
        check_replies(fuzzer.exchange(as_text({"type": "cancel", "context": context})))


@settings(FUZZ, max_examples=100)
@given(st.text(max_size=200))
def test_random_text_frames(fuzzer: Fuzzer, text: str) -> None:
    replies = fuzzer.exchange(text)
    check_replies(replies)
    for context in {m["context"] for m in replies if m["type"] == "started"}:
        check_replies(fuzzer.exchange(as_text({"type": "cancel", "context": context})))


@settings(FUZZ, max_examples=100)
@given(st.binary(max_size=300))
def test_random_binary_frames_are_refused_and_the_socket_stays(fuzzer: Fuzzer, data: bytes) -> None:
    replies = fuzzer.exchange(data)
    assert [m.get("code") for m in replies] == ["binary_not_supported"]


@settings(FUZZ, max_examples=40)
@given(st.binary(min_size=1, max_size=60))
def test_invalid_utf8_in_text_frames(fuzzer: Fuzzer, data: bytes) -> None:
    try:
        data.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    closes_before = len(fuzzer.closes)
    replies = fuzzer.exchange(data, text=True)
    if valid:
        check_replies(replies)
    else:
        # The WebSocket layer must reject it: close 1007 (invalid frame payload data).
        assert fuzzer.closes[closes_before:] == [1007]


def test_oversized_frames(fuzzer: Fuzzer, server: ServerProcess) -> None:
    # Over the limit: an error, and the socket stays usable.
    over = json.dumps({"type": "text", "context": "x", "text": "a" * (MAX_MESSAGE_BYTES + 10)})
    assert [m["code"] for m in fuzzer.exchange(over)] == ["message_too_big"]
    # Few characters, many bytes (3 per "€"): the limit is in bytes.
    euros = {"type": "text", "context": "x", "text": "€" * (MAX_MESSAGE_BYTES // 2)}
    multibyte = json.dumps(euros, ensure_ascii=False)
    assert [m["code"] for m in fuzzer.exchange(multibyte)] == ["message_too_big"]
    assert fuzzer.ws is not None
    # Far beyond (over 4x): the socket is closed with 1009.
    huge = "x" * (MAX_MESSAGE_BYTES * 4 + 100)
    assert fuzzer.exchange(huge) == [] and fuzzer.closes[-1] == 1009
    assert_still_serving(server)


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["start", "text", "flush", "end", "cancel"]),
        st.sampled_from(["m1", "m2", "m3", "m4"]),
        st.sampled_from(["", "Hi.", "Hello there, friend", " and more. Then", "x" * 600]),
    ),
    min_size=1,
    max_size=25,
)


@settings(FUZZ, max_examples=40)
@given(ACTIONS)
def test_random_message_orders(fuzzer: Fuzzer, actions: list[tuple[str, str, str]]) -> None:
    replies: list[dict[str, Any]] = []
    for kind, context, text in actions:
        message: dict[str, Any] = {"type": kind, "context": context}
        if kind == "text":
            message["text"] = text
        replies += fuzzer.exchange(as_text(message))
    check_replies(replies)
    codes = {m["code"] for m in replies if m["type"] == "error"}
    expected = {
        "unknown_context",
        "context_exists",
        "context_ended",
        "too_many_contexts",
        "text_too_long",
    }
    assert codes <= expected, codes
    # Leave nothing open for the next example.
    for context in ("m1", "m2", "m3", "m4"):
        check_replies(fuzzer.exchange(as_text({"type": "cancel", "context": context})))


def test_the_server_survived_it_all(fuzzer: Fuzzer, server: ServerProcess) -> None:
    """Runs last in this module: after every fuzz test the server is up and speaks."""
    assert_still_serving(server)
    errors = {
        name.split('"')[1]: value
        for name, value in parse_exposition(httpx.get(server.url + "/metrics").text).items()
        if name.startswith("streamtts_errors_total{")
    }
    # The fuzzing above reached these (so it was not answered by something else entirely).
    for code in ("invalid_json", "binary_not_supported", "message_too_big", "unknown_context"):
        assert errors.get(code, 0) > 0, (code, errors)
    assert set(errors) <= DOCUMENTED_CODES
