"""Settings of the Wyoming server (Home Assistant): off unless a port is given."""

from __future__ import annotations

from dataclasses import dataclass

from streamtts.bounds import SettingsError, require_bounds

MAX_PORT = 65535


@dataclass(frozen=True)
class WyomingSettings:
    # TCP port of the Wyoming server; 0 = no Wyoming server. Home Assistant's convention: 10200.
    wyoming_port: int = 0
    # Bind address; empty = the HTTP server's host.
    wyoming_host: str = ""
    # Advertise the server on the local network (mDNS `_wyoming._tcp`) for Home Assistant's
    # discovery, under this name (empty: "streamtts-<hostname>").
    wyoming_zeroconf: bool = False
    wyoming_zeroconf_name: str = ""
    # Bounds on one incoming event: its JSON header line, its JSON data block and its binary
    # payload (a TTS server takes no payload: one within the bound is read and dropped).
    # Beyond any of them the client gets an `error` event and the connection is closed.
    wyoming_max_line_bytes: int = 64 * 1024
    wyoming_max_data_bytes: int = 1 << 20
    wyoming_max_payload_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        require_bounds(self, wyoming_max_line_bytes=256, wyoming_max_data_bytes=1)
        if self.wyoming_port > MAX_PORT:
            raise SettingsError(f"wyoming_port must be 0..{MAX_PORT}, got {self.wyoming_port}")

    @property
    def enabled(self) -> bool:
        return self.wyoming_port != 0
