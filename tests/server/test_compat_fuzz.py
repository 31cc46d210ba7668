"""Fuzzing the ElevenLabs and Cartesia sockets as the native one is fuzzed (test_fuzz.py):
random JSON, near-valid messages, random text and bytes, invalid UTF-8 and oversized frames.
Every bad frame gets the protocol's documented answer, the server never breaks, and a normal
request works afterwards.

Each example runs on a fresh socket of an in-process server (a fake engine, so it is cheap): the
fuzz frame, then a probe whose answer is known; everything before the probe's answer answers
the fuzz frame.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from streamtts.config import Settings
from tests.app_server import RunningApp, serve_app_in_thread
from tests.fake_engine import FakeEngine
from tests.strategies import JSON_VALUES, near_cartesia_messages, near_elevenlabs_messages

MAX_MESSAGE_BYTES = 4096
DOC = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
DOCUMENTED = set(re.findall(r"`([a-z_]+)`", DOC))
RECV_TIMEOUT_S = 20.0
F32 = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}
MULTI = "/v1/text-to-speech/default/multi-stream-input?output_format=pcm_16000"
SINGLE = "/v1/text-to-speech/default/stream-input?output_format=pcm_16000"
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def app() -> Iterator[RunningApp]:
    limits = Settings().replace(
        max_ws_message_bytes=MAX_MESSAGE_BYTES,
        max_text_per_message_chars=500,
        max_contexts_per_socket=3,
    )
    with serve_app_in_thread(FakeEngine(samples_per_char=4), limits) as running:
        yield running


class Exchange:
    """One socket: the fuzz frame, the probe, and what answered the fuzz frame."""

    def __init__(self, url: str, probe: str, is_probe_answer: Any) -> None:
        self.url, self.probe, self.is_probe_answer = url, probe, is_probe_answer
        self.close_code: int | None = None

    def run(self, frame: str | bytes, *, text: bool | None = None, opening: str = "") -> list[Any]:
        replies: list[dict[str, Any]] = []
        with connect(self.url, max_size=None, open_timeout=20) as ws:
            try:
                if opening:
                    ws.send(opening)
                ws.send(frame, text=text)
                ws.send(self.probe)
                while True:
                    raw = ws.recv(timeout=RECV_TIMEOUT_S)
                    assert isinstance(raw, str), "JSON text frames only"
                    message = orjson.loads(raw)
                    assert isinstance(message, dict)
                    if self.is_probe_answer(message):
                        return replies
                    replies.append(message)
            except ConnectionClosed as exc:
                assert exc.rcvd is not None, "the server dropped the socket without a close frame"
                self.close_code = exc.rcvd.code
                return replies


# ---- ElevenLabs ----


def elevenlabs_probe(url: str) -> Exchange:
    if "multi" in url:
        probe = {"context_id": "__probe", "close_context": True}
        return Exchange(url, json.dumps(probe), lambda m: m.get("contextId") == "__probe")
    # stream-input: after the opening message, invalid JSON always gets invalid_json.
    return Exchange(url, "{", lambda m: m.get("error") == "invalid_json")


def check_elevenlabs(replies: list[dict[str, Any]], exchange: Exchange) -> None:
    for message in replies:
        if "error" in message:
            assert message["error"] in DOCUMENTED, message
            assert isinstance(message["message"], str) and message["message"]
            if "code" in message:
                assert message["code"] in (1000, 1008, 1011, 1013), message
        elif "audio" in message:
            assert isinstance(message["audio"], str) and message["audio"]
        else:
            assert message.get("isFinal") is True, message
    if exchange.close_code is not None:
        assert exchange.close_code in (1000, 1007, 1008, 1009, 1011), exchange.close_code


@settings(FUZZ, max_examples=120)
@given(st.one_of(JSON_VALUES, near_elevenlabs_messages(st.sampled_from(["a", "b", ""]))))
def test_elevenlabs_multi_random_json(app: RunningApp, value: object) -> None:
    exchange = elevenlabs_probe(app.ws_url + MULTI)
    check_elevenlabs(exchange.run(json.dumps(value)), exchange)


@settings(FUZZ, max_examples=80)
@given(st.one_of(JSON_VALUES, near_elevenlabs_messages(st.just("ignored"))))
def test_elevenlabs_stream_input_random_json(app: RunningApp, value: object) -> None:
    exchange = elevenlabs_probe(app.ws_url + SINGLE)
    replies = exchange.run(json.dumps(value), opening='{"text": " "}')
    check_elevenlabs(replies, exchange)


@settings(FUZZ, max_examples=60)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_elevenlabs_random_frames(app: RunningApp, frame: str | bytes) -> None:
    exchange = elevenlabs_probe(app.ws_url + MULTI)
    replies = exchange.run(frame)
    check_elevenlabs(replies, exchange)
    if isinstance(frame, bytes):
        assert [m["error"] for m in replies] == ["binary_not_supported"]


# ---- Cartesia ----


def cartesia_probe(url: str) -> Exchange:
    probe = {"context_id": "__probe", "transcript": "x", "voice": "nobody", "output_format": F32}
    return Exchange(url, json.dumps(probe), lambda m: m.get("context_id") == "__probe")


def check_cartesia(replies: list[dict[str, Any]], exchange: Exchange) -> None:
    for message in replies:
        assert "context_id" in message and message["type"] in (
            "chunk",
            "flush_done",
            "done",
            "error",
        ), message
        if message["type"] == "error":
            assert message["error_code"] in DOCUMENTED, message
            assert message["done"] is True and isinstance(message["status_code"], int)
            assert isinstance(message["title"], str) and message["message"]
    assert exchange.close_code in (None, 1007, 1009), exchange.close_code


@settings(FUZZ, max_examples=120)
@given(st.one_of(JSON_VALUES, near_cartesia_messages(st.sampled_from(["a", "b", ""]))))
def test_cartesia_random_json(app: RunningApp, value: object) -> None:
    exchange = cartesia_probe(app.ws_url + "/tts/websocket")
    check_cartesia(exchange.run(json.dumps(value)), exchange)


@settings(FUZZ, max_examples=60)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_cartesia_random_frames(app: RunningApp, frame: str | bytes) -> None:
    exchange = cartesia_probe(app.ws_url + "/tts/websocket")
    replies = exchange.run(frame)
    check_cartesia(replies, exchange)
    if isinstance(frame, bytes):
        assert [m["error_code"] for m in replies] == ["binary_not_supported"]


# ---- both ----


@pytest.mark.parametrize("path", [MULTI, "/tts/websocket"])
@settings(FUZZ, max_examples=20)
@given(data=st.binary(min_size=1, max_size=40))
def test_invalid_utf8_is_closed_with_1007(app: RunningApp, path: str, data: bytes) -> None:
    try:
        data.decode()
        return  # valid UTF-8: covered by the random frames
    except UnicodeDecodeError:
        pass
    exchange = (cartesia_probe if "tts/websocket" in path else elevenlabs_probe)(app.ws_url + path)
    assert exchange.run(data, text=True) == [] and exchange.close_code == 1007


@pytest.mark.parametrize("path", [MULTI, "/tts/websocket"])
def test_oversized_frames(app: RunningApp, path: str) -> None:
    exchange = (cartesia_probe if "tts/websocket" in path else elevenlabs_probe)(app.ws_url + path)
    over = json.dumps({"text": "a" * (MAX_MESSAGE_BYTES + 10), "transcript": "", "context_id": "x"})
    [reply] = exchange.run(over)
    assert "message_too_big" in (reply.get("error"), reply.get("error_code"))
    assert exchange.close_code is None  # the socket stays usable


def test_still_serving_after_the_fuzzing(app: RunningApp) -> None:
    with connect(app.ws_url + MULTI) as ws:
        ws.send(json.dumps({"text": "Still fine.", "context_id": "ok", "flush": True}))
        ws.send(json.dumps({"context_id": "ok", "close_context": True}))
        messages = []
        while not messages or not messages[-1].get("isFinal"):
            messages.append(orjson.loads(ws.recv(timeout=RECV_TIMEOUT_S)))
        assert any(m.get("audio") for m in messages)
    with connect(app.ws_url + "/tts/websocket") as ws:
        request = {"context_id": "ok", "transcript": "Fine.", "voice": "default"}
        ws.send(json.dumps({**request, "output_format": F32}))
        kinds = []
        while "done" not in kinds:
            kinds.append(orjson.loads(ws.recv(timeout=RECV_TIMEOUT_S))["type"])
        assert "chunk" in kinds
