"""Per-message, per-context, per-socket and server-wide limits. Exceeding one yields a documented
error (docs/protocol.md); every default and outcome is in docs/operations.md."""

from __future__ import annotations

from dataclasses import dataclass

from streamtts.bounds import require_bounds


@dataclass(frozen=True)
class Limits:
    max_ws_message_bytes: int = 1 << 20
    max_text_per_message_chars: int = 10_000
    max_text_per_context_chars: int = 100_000
    max_contexts_per_socket: int = 16
    max_http_input_chars: int = 4096
    # A request body (POST /v1/tts: msgpack or JSON, inline reference audio included).
    max_http_body_bytes: int = 10 << 20
    idle_timeout_s: float = 300.0
    # Admission control: contexts (WebSocket) plus speech requests (HTTP) in flight at once,
    # server-wide. Beyond it: `overloaded` / close 1013 / HTTP 429 with Retry-After.
    max_active_contexts: int = 64
    # Audio queued for one context that the socket has not taken yet (a slow reader); beyond
    # it the context ends with `slow_consumer`.
    max_output_buffer_ms: float = 20_000.0

    def __post_init__(self) -> None:
        require_bounds(
            self,
            max_ws_message_bytes=1,
            max_text_per_message_chars=1,
            max_contexts_per_socket=1,
            max_http_input_chars=1,
            max_http_body_bytes=1,
            max_active_contexts=1,
        )
