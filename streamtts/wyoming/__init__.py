"""The Wyoming protocol (Home Assistant's voice pipeline), I/O-free: bounded event framing, the
``describe`` answer and the event → session translation. The TCP shell is
``streamtts.server.wyoming``."""
