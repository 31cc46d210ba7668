"""Wire protocols over the one WebSocket shell: each an I/O-free translation (``base.Dialect``)
between its frames and the session core (native, ElevenLabs, Cartesia)."""
