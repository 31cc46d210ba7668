"""API keys and the Origin allow-list on every interface, against a real server with keys set."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from streamtts.server.auth import ApiKeys, redact, warn_if_exposed
from tests.servers import REPO_DIR, ServerProcess

ENV_KEY = "env-key-0123456789abcdef"
OTHER_ENV_KEY = "second-env-key-fedcba9876"
FILE_KEY = "file-key-aabbccddeeff0011"
WRONG_KEY = "env-key-0123456789abcdeX"
ALLOWED_ORIGIN = "https://app.example.com"
GOOD_KEYS = (ENV_KEY, OTHER_ENV_KEY, FILE_KEY)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# one key per line\n{FILE_KEY}\n\n")
    proc = ServerProcess(
        env={
            "STREAMTTS_API_KEYS": f"{ENV_KEY}, {OTHER_ENV_KEY}",
            "STREAMTTS_API_KEY_FILE": str(key_file),
            "STREAMTTS_ALLOWED_ORIGINS": ALLOWED_ORIGIN,
        }
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def bearer(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


# ---- HTTP ------------------------------------------------------------------------------------

PROTECTED_GETS = ("/v1/models", "/v1/voices", "/v1/audio/voices", "/metrics")
SPEECH_BODY = {"model": "tts-1", "input": "Hi there.", "voice": "alloy", "response_format": "pcm"}


def assert_unauthorized(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].lower().startswith("bearer")
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", PROTECTED_GETS)
@pytest.mark.parametrize("key", [None, WRONG_KEY, ""])
def test_protected_gets_refuse_missing_and_wrong_keys(
    server: ServerProcess, path: str, key: str | None
) -> None:
    headers = {"Authorization": "Bearer"} if key == "" else bearer(key)
    assert_unauthorized(httpx.get(server.url + path, headers=headers))


@pytest.mark.parametrize("path", PROTECTED_GETS)
@pytest.mark.parametrize("key", GOOD_KEYS)
def test_protected_gets_accept_every_configured_key(
    server: ServerProcess, path: str, key: str
) -> None:
    assert httpx.get(server.url + path, headers=bearer(key)).status_code == 200


def test_query_token_works_for_http_too(server: ServerProcess) -> None:
    assert httpx.get(server.url + f"/v1/models?token={FILE_KEY}").status_code == 200
    assert_unauthorized(httpx.get(server.url + f"/v1/models?token={WRONG_KEY}"))


def test_other_auth_schemes_are_refused(server: ServerProcess) -> None:
    headers = {"Authorization": f"Basic {ENV_KEY}"}
    assert_unauthorized(httpx.get(server.url + "/v1/models", headers=headers))


@pytest.mark.parametrize("key", [None, WRONG_KEY])
def test_speech_refuses_missing_and_wrong_keys(server: ServerProcess, key: str | None) -> None:
    response = httpx.post(server.url + "/v1/audio/speech", json=SPEECH_BODY, headers=bearer(key))
    assert_unauthorized(response)


def test_speech_with_a_key_returns_audio(server: ServerProcess) -> None:
    response = httpx.post(
        server.url + "/v1/audio/speech", json=SPEECH_BODY, headers=bearer(ENV_KEY), timeout=60
    )
    assert response.status_code == 200
    assert len(response.content) > 24_000  # > 0.5 s of 24 kHz s16le


def test_probes_and_the_page_stay_open(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert httpx.get(server.url + "/readyz").status_code == 200
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "token" in page.text


def test_rejections_are_counted(server: ServerProcess) -> None:
    httpx.get(server.url + "/v1/models")
    metrics = httpx.get(server.url + "/metrics", headers=bearer(ENV_KEY)).text
    assert 'streamtts_rejected_total{cause="unauthorized"}' in metrics


# ---- WebSocket -------------------------------------------------------------------------------


async def open_socket(
    server: ServerProcess,
    *,
    query: str = "",
    headers: dict[str, str] | None = None,
    subprotocols: list[str] | None = None,
    origin: str | None = None,
) -> ClientConnection:
    return await connect(
        server.ws_url + "/v1/stream" + query,
        additional_headers=headers,
        subprotocols=subprotocols,  # type: ignore[arg-type]
        origin=origin,  # type: ignore[arg-type]
        open_timeout=20,
    )


async def refused_with(ws: ClientConnection) -> int | None:
    """The close code the server sends before answering anything."""
    with pytest.raises(ConnectionClosed) as closed:
        await ws.send(orjson.dumps({"type": "start", "context": "a"}).decode())
        await ws.recv()
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


async def works(ws: ClientConnection) -> dict[str, Any]:
    await ws.send(orjson.dumps({"type": "start", "context": "a"}).decode())
    message: dict[str, Any] = orjson.loads(await ws.recv())
    await ws.close()
    assert message["type"] == "started", message
    return message


async def test_socket_without_a_key_is_closed_with_1008(server: ServerProcess) -> None:
    assert await refused_with(await open_socket(server)) == 1008


@pytest.mark.parametrize("key", GOOD_KEYS)
async def test_socket_with_a_bearer_header(server: ServerProcess, key: str) -> None:
    await works(await open_socket(server, headers=bearer(key)))


async def test_socket_with_a_wrong_bearer_header(server: ServerProcess) -> None:
    assert await refused_with(await open_socket(server, headers=bearer(WRONG_KEY))) == 1008


async def test_socket_with_a_query_token(server: ServerProcess) -> None:
    await works(await open_socket(server, query=f"?token={ENV_KEY}"))
    assert await refused_with(await open_socket(server, query=f"?token={WRONG_KEY}")) == 1008


async def test_socket_with_a_bearer_subprotocol(server: ServerProcess) -> None:
    both = await open_socket(server, subprotocols=["streamtts", f"streamtts.bearer.{FILE_KEY}"])
    assert both.subprotocol == "streamtts"
    await works(both)
    alone = await open_socket(server, subprotocols=[f"streamtts.bearer.{ENV_KEY}"])
    assert alone.subprotocol == f"streamtts.bearer.{ENV_KEY}"
    await works(alone)
    wrong = await open_socket(server, subprotocols=["streamtts", f"streamtts.bearer.{WRONG_KEY}"])
    assert await refused_with(wrong) == 1008


async def test_origin_allow_list(server: ServerProcess) -> None:
    key = bearer(ENV_KEY)
    await works(await open_socket(server, headers=key, origin=ALLOWED_ORIGIN))
    # The server's own host is always allowed (the bundled page).
    await works(await open_socket(server, headers=key, origin=server.url))
    evil = await open_socket(server, headers=key, origin="https://evil.example.com")
    assert await refused_with(evil) == 1008
    # An allowed origin does not replace the key.
    assert await refused_with(await open_socket(server, origin=ALLOWED_ORIGIN)) == 1008


def test_keys_never_reach_the_log(server: ServerProcess) -> None:
    httpx.get(server.url + f"/v1/models?token={ENV_KEY}")
    httpx.get(server.url + f"/v1/models?token={WRONG_KEY}")
    log = server.log_path.read_text()
    assert "/v1/models" in log  # the access log is on, so the check below means something
    for key in (*GOOD_KEYS, WRONG_KEY):
        assert key not in log


async def test_keys_never_reach_the_log_from_sockets(server: ServerProcess) -> None:
    await works(await open_socket(server, query=f"?token={OTHER_ENV_KEY}"))
    await works(await open_socket(server, subprotocols=[f"streamtts.bearer.{FILE_KEY}"]))
    log = server.log_path.read_text()
    assert "/v1/stream" in log
    assert OTHER_ENV_KEY not in log and FILE_KEY not in log


# ---- an open server, and the exposure warning -----------------------------------------------


async def test_a_server_without_keys_is_open(live_server: str) -> None:
    assert httpx.get(live_server + "/v1/models").status_code == 200
    ws = await connect(live_server.replace("http", "ws") + "/v1/stream")
    await works(ws)


async def test_an_open_server_still_checks_origins(live_server: str) -> None:
    ws = await connect(
        live_server.replace("http", "ws") + "/v1/stream",
        origin="https://evil.example.com",  # type: ignore[arg-type]
    )
    assert await refused_with(ws) == 1008


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``streamtts serve`` with a model that cannot load: it logs its warnings, then fails
    before binding anything."""
    return subprocess.run(
        [sys.executable, "-m", "streamtts", "serve", "--model", "no-such-model", *args],
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


def test_non_loopback_bind_without_a_key_warns_loudly() -> None:
    exposed = run_serve("--host", "0.0.0.0")
    assert "SECURITY" in exposed.stderr and "0.0.0.0" in exposed.stderr
    assert "unknown model" in exposed.stderr  # it stopped before binding
    assert "SECURITY" not in run_serve("--host", "127.0.0.1").stderr
    keyed = run_serve("--host", "0.0.0.0", env={"STREAMTTS_API_KEYS": ENV_KEY})
    assert "SECURITY" not in keyed.stderr


def test_warn_if_exposed(caplog: pytest.LogCaptureFixture) -> None:
    no_keys, keys = ApiKeys([]), ApiKeys([ENV_KEY])
    logger = logging.getLogger("test-exposure")
    with caplog.at_level(logging.WARNING, logger="test-exposure"):
        assert warn_if_exposed("0.0.0.0", no_keys, logger)
        assert warn_if_exposed("::", no_keys, logger)
        assert warn_if_exposed("192.168.1.5", no_keys, logger)
        assert not warn_if_exposed("127.0.0.1", no_keys, logger)
        assert not warn_if_exposed("127.8.9.1", no_keys, logger)
        assert not warn_if_exposed("::1", no_keys, logger)
        assert not warn_if_exposed("localhost", no_keys, logger)
        assert not warn_if_exposed("0.0.0.0", keys, logger)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 3


def test_api_keys_check() -> None:
    keys = ApiKeys([ENV_KEY, " " + FILE_KEY + " ", "", ENV_KEY])
    assert len(keys) == 2
    assert keys.check(ENV_KEY) and keys.check(FILE_KEY)
    assert not keys.check(WRONG_KEY) and not keys.check("") and not keys.check(None)
    assert not keys.check(ENV_KEY[:-1]) and not keys.check(ENV_KEY + "x")
    assert ApiKeys([]).check(None)  # no keys: open


def test_redact() -> None:
    line = f'127.0.0.1:5 - "WebSocket /v1/stream?a=1&token={ENV_KEY}&b=2" [accepted]'
    assert ENV_KEY not in redact(line) and "a=1" in redact(line) and "b=2" in redact(line)
    assert FILE_KEY not in redact(f"protocols: streamtts, streamtts.bearer.{FILE_KEY}")
    cartesia = f'"WebSocket /tts/websocket?api_key={ENV_KEY}&x=1" [accepted]'
    assert ENV_KEY not in redact(cartesia) and "x=1" in redact(cartesia)


def test_a_missing_key_file_is_a_clear_error(tmp_path: Path) -> None:
    result = run_serve(env={"STREAMTTS_API_KEY_FILE": str(tmp_path / "nope.txt")})
    assert result.returncode == 2
    assert "API key file" in result.stderr
