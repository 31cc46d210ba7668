"""API keys and the browser Origin allow-list, enforced by one ASGI middleware before any work.

Credentials, in the order they are looked for (the same keys for every interface):

- ``Authorization: Bearer <key>`` (HTTP and WebSocket; the Cartesia SDK),
- ``xi-api-key: <key>`` (ElevenLabs clients) or ``X-API-Key: <key>`` (Pipecat's Cartesia
  service),
- ``?token=<key>`` or ``?api_key=<key>`` (Cartesia) in the URL (browsers cannot set headers on a
  WebSocket),
- the WebSocket subprotocol ``streamtts.bearer.<key>`` (``Sec-WebSocket-Protocol``); the server
  answers with the subprotocol ``streamtts`` when the client offered it too, else with the
  ``streamtts.bearer.<key>`` entry it was sent (a browser requires one offered entry back).

Keys are compared with :func:`hmac.compare_digest` against every configured key (no early
exit). Protected: every path under ``/v1/`` and ``/tts/`` and ``/metrics``; ``/healthz``,
``/readyz`` and the static player page stay open. A refused HTTP request gets 401 with an
OpenAI-style error body and ``WWW-Authenticate: Bearer``; a refused WebSocket gets its
protocol's refusal (``Dialect.refusal``: the native protocol and ElevenLabs accept and close at
once with 1008, so browsers see the code; Cartesia answers the handshake with HTTP 401), before
the endpoint runs.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from streamtts.config import Settings
from streamtts.server.dialects.base import Dialect, RefusalCause
from streamtts.server.dialects.native import NativeDialect
from streamtts.server.refusal import send_refusal

log = logging.getLogger(__name__)

SUBPROTOCOL = "streamtts"
BEARER_SUBPROTOCOL_PREFIX = "streamtts.bearer."
SUBPROTOCOL_SCOPE_KEY = "streamtts.subprotocol"
_OPEN_PATHS = ("/healthz", "/readyz")
_KEY_HEADERS = (b"xi-api-key", b"x-api-key")
_KEY_QUERY_PARAMS = ("token", "api_key")


class ApiKeys:
    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [k.encode() for k in dict.fromkeys(k.strip() for k in keys) if k]

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        keys = settings.api_keys.split(",")
        if settings.api_key_file:
            text = Path(settings.api_key_file).read_text(encoding="utf-8")
            keys += [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def check(self, candidate: str | None) -> bool:
        """True when ``candidate`` is one of the keys (or no key is configured)."""
        if not self._keys:
            return True
        if not candidate:
            return False
        given = candidate.encode()
        match = False
        for key in self._keys:  # every key, every time: the timing says nothing
            match |= hmac.compare_digest(given, key)
        return match


def is_protected(path: str) -> bool:
    return path.startswith(("/v1/", "/tts/")) or path in ("/v1", "/metrics")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None


def offered_subprotocols(scope: Scope) -> list[str]:
    subprotocols = scope.get("subprotocols")
    if subprotocols is not None:
        return [str(s) for s in subprotocols]
    raw = _header(scope, b"sec-websocket-protocol") or ""
    return [s.strip() for s in raw.split(",") if s.strip()]


def credential(scope: Scope) -> tuple[str | None, str | None]:
    """The key the client presented and the subprotocol it came in, if any."""
    authorization = _header(scope, b"authorization")
    if authorization is not None:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip(), None
    for name in _KEY_HEADERS:
        key = _header(scope, name)
        if key is not None and key.strip():
            return key.strip(), None
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    for param in _KEY_QUERY_PARAMS:
        if query.get(param):
            return query[param][0], None
    for entry in offered_subprotocols(scope):
        if entry.startswith(BEARER_SUBPROTOCOL_PREFIX):
            return entry[len(BEARER_SUBPROTOCOL_PREFIX) :], entry
    return None, None


def answer_subprotocol(scope: Scope, bearer_entry: str | None) -> str | None:
    """The subprotocol to accept the socket with (one the client offered, or None)."""
    offered = offered_subprotocols(scope)
    if SUBPROTOCOL in offered:
        return SUBPROTOCOL
    return bearer_entry


class OriginPolicy:
    """Browser WebSockets: an Origin equal to the request's host, or one of ``allowed``."""

    def __init__(self, allowed: str) -> None:
        entries = [o.strip().rstrip("/").lower() for o in allowed.split(",") if o.strip()]
        self.any = "*" in entries
        self.allowed = frozenset(entries)

    def allows(self, scope: Scope) -> bool:
        origin = _header(scope, b"origin")
        if origin is None:
            return True  # not a browser
        origin = origin.strip().rstrip("/").lower()
        if self.any or origin in self.allowed:
            return True
        host = (_header(scope, b"host") or "").strip().lower()
        return bool(host) and urlsplit(origin).netloc == host


class SecurityMiddleware:
    """``dialect_for_path`` names the protocol of a WebSocket path, whose refusal a refused
    socket gets (default: the native protocol's)."""

    def __init__(
        self,
        app: ASGIApp,
        keys: ApiKeys,
        origins: OriginPolicy,
        on_reject: Callable[[str], None] = lambda cause: None,
        dialect_for_path: Callable[[str], type[Dialect]] = lambda path: NativeDialect,
    ) -> None:
        self.app, self.keys, self.origins, self.on_reject = app, keys, origins, on_reject
        self.dialect_for_path = dialect_for_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if is_protected(scope["path"]) and not self.keys.check(credential(scope)[0]):
                self.on_reject("unauthorized")
                await _unauthorized(send)
                return
        elif scope["type"] == "websocket":
            key, bearer_entry = credential(scope)
            if not self.origins.allows(scope):
                await self._refuse_socket(
                    scope, receive, send, bearer_entry, RefusalCause.ORIGIN, "origin not allowed"
                )
                return
            if is_protected(scope["path"]) and not self.keys.check(key):
                message = "unauthorized: a valid API key is required"
                await self._refuse_socket(
                    scope, receive, send, bearer_entry, RefusalCause.UNAUTHORIZED, message
                )
                return
            scope = {**scope, SUBPROTOCOL_SCOPE_KEY: answer_subprotocol(scope, bearer_entry)}
        await self.app(scope, receive, send)

    async def _refuse_socket(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        bearer_entry: str | None,
        cause: RefusalCause,
        message: str,
    ) -> None:
        self.on_reject(str(cause))
        refusal = self.dialect_for_path(scope["path"]).refusal(cause, message)
        ws = WebSocket(scope, receive, send)
        await send_refusal(ws, refusal, answer_subprotocol(scope, bearer_entry))


async def _unauthorized(send: Send) -> None:
    body = orjson.dumps(
        {
            "error": {
                "message": "a valid API key is required: 'Authorization: Bearer <key>'",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
    )
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer realm="streamtts"'),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---- startup checks and logs ----------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


EXPOSED_WARNING = (
    "!!! SECURITY: streamtts is listening on %s without an API key: anyone who can reach this "
    "address can use it. Set STREAMTTS_API_KEYS or STREAMTTS_API_KEY_FILE, or bind 127.0.0.1. !!!"
)


def warn_if_exposed(host: str, keys: ApiKeys, logger: logging.Logger = log) -> bool:
    """Log a loud warning when a non-loopback address is bound with no key. True if warned."""
    if keys.enabled or is_loopback(host):
        return False
    logger.warning(EXPOSED_WARNING, host)
    return True


_TOKEN_IN_URL = re.compile(r"((?:token|api_key|authorization)=)[^&\s\"']+", re.IGNORECASE)
_BEARER_SUBPROTOCOL = re.compile(r"(streamtts\.bearer\.)[^,\s\"']+")


def redact(text: str) -> str:
    return _BEARER_SUBPROTOCOL.sub(r"\1***", _TOKEN_IN_URL.sub(r"\1***", text))


class RedactKeysFilter(logging.Filter):
    """Keeps keys passed in the URL (``?token=``, ``?api_key=``) out of the access and
    WebSocket logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def install_log_redaction() -> None:
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "streamtts"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeysFilter) for f in logger.filters):
            logger.addFilter(RedactKeysFilter())
