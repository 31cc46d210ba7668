"""Zeroconf (mDNS) advertisement of the Wyoming server as ``_wyoming._tcp``, the way Home
Assistant discovers Wyoming services (wyoming-piper's ``--zeroconf``), with the ``zeroconf``
package. Off unless ``STREAMTTS_WYOMING_ZEROCONF`` is set; withdrawn when the server stops."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket

from zeroconf import InterfaceChoice
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

log = logging.getLogger(__name__)

SERVICE_TYPE = "_wyoming._tcp.local."
# A UDP "connection" to the mDNS group sends nothing; it only makes the OS pick the address it
# would use to reach the local network.
_MDNS_GROUP = ("224.0.0.251", 5353)
_UNSPECIFIED = ("", "0.0.0.0", "::")


def instance_name(name: str) -> str:
    """The service instance name: ``name``, else ``streamtts-<hostname>`` (DNS-label safe)."""
    label = name or f"streamtts-{socket.gethostname()}"
    return re.sub(r"[^A-Za-z0-9-]+", "-", label).strip("-")[:63] or "streamtts"


class WyomingAdvertisement:
    def __init__(
        self,
        host: str,
        port: int,
        name: str,
        interfaces: InterfaceChoice | list[str] = InterfaceChoice.All,
    ) -> None:
        self._host = host
        self._port = port
        self.name = instance_name(name)
        self._interfaces = interfaces
        self._zeroconf: AsyncZeroconf | None = None
        self._info: AsyncServiceInfo | None = None

    async def start(self) -> None:
        address = await _advertised_address(self._host)
        self._info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{self.name}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(address)],
            port=self._port,
        )
        self._zeroconf = AsyncZeroconf(interfaces=self._interfaces)
        await self._zeroconf.async_register_service(self._info, allow_name_change=True)
        log.info("Wyoming server advertised as %s at %s:%d", self._info.name, address, self._port)

    async def stop(self) -> None:
        if self._zeroconf is None:
            return
        if self._info is not None:
            await self._zeroconf.async_unregister_service(self._info)
        await self._zeroconf.async_close()
        self._zeroconf = None


async def _advertised_address(host: str) -> str:
    """The IPv4 address clients should connect to for a server bound to ``host``."""
    if host in _UNSPECIFIED:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(_MDNS_GROUP)
                address: str = probe.getsockname()[0]
                return address
            except OSError:
                return "127.0.0.1"
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, family=socket.AF_INET)
    return str(infos[0][4][0])
