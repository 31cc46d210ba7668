"""What the app's parts share: settings, engine, voices, admission, lifecycle, metrics."""

from __future__ import annotations

from streamtts.config import Settings
from streamtts.engine.base import Engine
from streamtts.server.admission import Admission, Ticket
from streamtts.server.metrics import Metrics
from streamtts.server.shutdown import Lifecycle
from streamtts.voices.catalog import VoiceCatalog


class AppState:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        by_capacity = settings.scheduling.admit_by_capacity
        self.admission = Admission(
            settings.limits.max_active_contexts,
            (lambda: engine.capacity().realtime_streams) if by_capacity else (lambda: None),
        )
        self.lifecycle = Lifecycle(self.admission)
        self.metrics = Metrics()
        self.voices = VoiceCatalog(engine, settings.voices)
        # Audio bytes queued for all contexts that their sockets have not taken yet.
        self.output_buffer_bytes = 0

    def admit_context(self) -> Ticket | str:
        """An admission ticket for a new streaming context, or why there is none (draining, or
        at capacity), in words for the client."""
        if self.lifecycle.draining:
            return "the server is shutting down; reconnect to another instance"
        ticket = self.admission.try_acquire()
        if ticket is None:
            return (
                f"the server is at its capacity of {self.admission.capacity} active contexts; "
                "try again shortly"
            )
        return ticket

    def add_output_buffer_bytes(self, delta: int) -> None:
        self.output_buffer_bytes += delta

    @property
    def ready(self) -> bool:
        return self.lifecycle.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self.lifecycle.ready = value
