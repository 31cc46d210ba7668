"""The Fish Audio API (``POST /v1/tts``, ``GET /v1/tts/live``), I/O-free: the TTS request and the
live socket's events. The shells are ``streamtts.server.fishapi`` and
``streamtts.server.fish_live``."""
