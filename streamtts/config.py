"""Server settings: one frozen dataclass, read from ``STREAMTTS_*`` environment variables and
CLI flags (flags win). Every limit has a documented default and outcome; see
docs/operations.md."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from streamtts.segmenter import SegmenterOptions

ENV_PREFIX = "STREAMTTS_"


class SettingsError(ValueError):
    """An environment variable or flag has a value of the wrong type or out of range."""


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    # "piper" (the bundled voice), "piper:/path/voice.onnx", a Fish-Speech 1.5 checkpoint
    # directory, or "synthetic:tiny" / "synthetic:1.5".
    model: str = "piper"
    log_level: str = "info"
    # Engine worker threads for CPU voices (Piper runs one synthesis per thread).
    engine_threads: int = 2

    # Fish-Speech engine. device/dtype "auto": CUDA if present; bf16 where the hardware has it.
    device: str = "auto"
    dtype: str = "auto"
    max_streams: int = 8  # KV-cache slots = concurrent Fish streams
    context_tokens: int = 4096  # per-stream KV length; the iterative prompt's budget
    first_chunk_frames: int = 4  # frames before the first audio of a segment (46.4 ms each)
    chunk_frames: int = 8  # frames per later vocoder chunk
    prefill_chunk_tokens: int = 128  # prompt tokens prefilled per step between decode steps
    max_frames_per_segment: int = 1024
    max_lead_s: float = 6.0  # streams this far ahead of real time yield compute to others
    cpu_threads: int = 0  # torch intra-op threads, process-wide (0: one per core)
    compile: bool = False  # torch.compile the Fish decode step at start (docs/operations.md)

    # Text segmentation (see streamtts.segmenter).
    first_segment_min_chars: int = 20
    max_segment_chars: int = 250
    max_buffer_delay_ms: int = 1500

    # Limits. Exceeding one yields a documented error; see docs/protocol.md.
    max_ws_message_bytes: int = 1 << 20
    max_text_per_message_chars: int = 10_000
    max_text_per_context_chars: int = 100_000
    max_contexts_per_socket: int = 16
    max_http_input_chars: int = 4096
    idle_timeout_s: float = 300.0
    # Admission control: contexts (WebSocket) plus speech requests (HTTP) in flight at once,
    # server-wide. Beyond it: `overloaded` / close 1013 / HTTP 429 with Retry-After.
    max_active_contexts: int = 64
    # Audio queued for one context that the socket has not taken yet (a slow reader); beyond
    # it the context ends with `slow_consumer`.
    max_output_buffer_ms: float = 20_000.0
    # Graceful shutdown (SIGTERM): in-flight contexts get this long to finish, then end with
    # `done` reason `shutdown`.
    shutdown_grace_s: float = 10.0
    # How often the watchdog checks the engine's worker threads.
    watchdog_interval_s: float = 0.5

    # Auth. Keys: comma-separated, and/or a file with one key per line. With no key the
    # server is open (fine on loopback; a non-loopback bind logs a loud warning).
    api_keys: str = field(default="", repr=False)  # never in a repr, so never in a log
    api_key_file: str = ""
    # Origins allowed to open WebSockets from a browser, comma-separated ("*" = any). An
    # Origin equal to the request's own host is always allowed; no Origin header (a
    # non-browser client) is allowed.
    allowed_origins: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``STREAMTTS_<FIELD>`` variables, then non-None ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.name, raw, type(getattr(cls(), f.name)))
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise SettingsError(f"unknown settings: {sorted(unknown)}")
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise SettingsError(f"{f.name} must be >= 0, got {value}")
        if not 0 < self.port < 65536:
            raise SettingsError(f"port must be 1..65535, got {self.port}")
        for name in (
            "engine_threads",
            "max_streams",
            "first_chunk_frames",
            "chunk_frames",
            "max_active_contexts",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1")
        if self.watchdog_interval_s <= 0:
            raise SettingsError("watchdog_interval_s must be > 0")

    def segmenter_options(self) -> SegmenterOptions:
        return SegmenterOptions(
            first_segment_min_chars=self.first_segment_min_chars,
            max_segment_chars=self.max_segment_chars,
            max_buffer_delay_ms=self.max_buffer_delay_ms,
        )

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _parse(name: str, raw: str, kind: type) -> Any:
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return raw
    except ValueError as exc:
        raise SettingsError(
            f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind.__name__}"
        ) from exc
