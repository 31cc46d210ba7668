"""Server settings: nested frozen dataclasses, validated on construction, read from flat
``STREAMTTS_<NAME>`` environment variables and CLI flags (flags win).

Every setting is defined once, in the section that owns it: :class:`Limits`, the segmenter's
:class:`SegmenterOptions`, the runtimes' :class:`FishSettings` and :class:`PiperSettings`, the
voice library's :class:`VoiceSettings`, the scheduler's :class:`SchedulingSettings`, the
Wyoming server's :class:`WyomingSettings`, and the server's own fields here. The environment
names stay flat (``STREAMTTS_MAX_STREAMS``, not ``STREAMTTS_FISH_MAX_STREAMS``): leaf names are
unique across sections. Every default and outcome is documented in docs/operations.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from streamtts.bounds import SettingsError, require_bounds
from streamtts.fish.settings import FishSettings
from streamtts.limits import Limits
from streamtts.piper.settings import PiperSettings
from streamtts.scheduling import SchedulingSettings
from streamtts.segmenter import SegmenterOptions
from streamtts.voices.settings import VoiceSettings
from streamtts.wyoming.settings import WyomingSettings

ENV_PREFIX = "STREAMTTS_"

__all__ = ["ENV_PREFIX", "Settings", "SettingsError", "leaves"]


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    # "piper" (the bundled voice), "piper:/path/voice.onnx", a Fish-Speech 1.5 checkpoint
    # directory, or "synthetic:tiny" / "synthetic:1.5".
    model: str = "piper"
    log_level: str = "info"
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
    # TLS: a PEM certificate (chain) and its private key; with both the server speaks only
    # https:// and wss:// (the ElevenLabs SDK connects with wss:// and nothing else).
    ssl_certfile: str = ""
    ssl_keyfile: str = ""

    limits: Limits = field(default_factory=Limits)
    segmenter: SegmenterOptions = field(default_factory=SegmenterOptions)
    fish: FishSettings = field(default_factory=FishSettings)
    piper: PiperSettings = field(default_factory=PiperSettings)
    voices: VoiceSettings = field(default_factory=VoiceSettings)
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    wyoming: WyomingSettings = field(default_factory=WyomingSettings)

    def __post_init__(self) -> None:
        require_bounds(self)
        if not 0 < self.port < 65536:
            raise SettingsError(f"port must be 1..65535, got {self.port}")
        if self.watchdog_interval_s <= 0:
            raise SettingsError("watchdog_interval_s must be > 0")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise SettingsError("TLS needs both ssl_certfile and ssl_keyfile, or neither")
        if self.wyoming.wyoming_port == self.port and self.wyoming_host == self.host:
            raise SettingsError(
                f"wyoming_port {self.port} is the HTTP port on the same host; use another "
                "(Home Assistant's convention is 10200)"
            )

    @property
    def tls(self) -> bool:
        return bool(self.ssl_certfile)

    @property
    def wyoming_host(self) -> str:
        """Where the Wyoming server binds: its own host setting, else the HTTP host."""
        return self.wyoming.wyoming_host or self.host

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``STREAMTTS_<NAME>`` variables, then non-None ``overrides`` (by leaf
        name, as the variables)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, default in leaves(cls()):
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = _parse(name, raw, type(default))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls().replace(**values)

    def replace(self, **changes: Any) -> Settings:
        """A copy with leaf settings changed by name (``max_streams=2``, ``port=9000``)."""
        known = {name for name, _ in leaves(self)}
        unknown = set(changes) - known
        if unknown:
            raise SettingsError(f"unknown settings: {sorted(unknown)}")
        try:
            replaced: Settings = _replaceleaves(self, changes)
            return replaced
        except SettingsError:
            raise
        except (TypeError, ValueError) as exc:
            raise SettingsError(str(exc)) from exc


def leaves(settings: Any) -> Iterator[tuple[str, Any]]:
    """(name, value) of every leaf setting, sections flattened."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if is_dataclass(value):
            yield from leaves(value)
        else:
            yield f.name, value


def _replaceleaves(settings: Any, changes: Mapping[str, Any]) -> Any:
    own: dict[str, Any] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if is_dataclass(value):
            section = _replaceleaves(value, changes)
            if section is not value:
                own[f.name] = section
        elif f.name in changes:
            own[f.name] = changes[f.name]
    return dataclasses.replace(settings, **own) if own else settings


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
