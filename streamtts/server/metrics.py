"""Prometheus metrics through ``prometheus-client``: one registry per app.

Every metric lives in its :class:`Metrics` object's own ``CollectorRegistry``, so tests and
several apps in one process never share state. ``/metrics`` is the text format 0.0.4 with the
metric names, labels and meanings dashboards rely on (docs/operations.md lists them), plus the
library's process and Python metrics (``process_*``, ``python_*``).

Two choices keep the exposition what it was before the library:

- the library adds a ``<name>_created`` gauge (a creation timestamp) beside every counter and
  histogram; it is left out, so a scrape carries no series it did not carry before;
- gauges are read at scrape time from callbacks registered by the parts that own the numbers
  (they cannot drift from the truth); a callback returning ``None`` omits its gauge (e.g. KV
  slots for an engine that has none) instead of exporting a made-up 0.

Adding a metric is one line: a counter or histogram as an attribute in :meth:`Metrics.__init__`
(``self.late_audio_total = self._counter(name, help, label)``), a gauge with
:meth:`Metrics.gauge` where its number lives. Histogram bucket labels are the library's
(``le="25.0"``), as Prometheus 3 writes them anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# Time to first audio, milliseconds.
TTFA_BUCKETS_MS = (25, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000)
# Audio sent ahead of the listener's playback, milliseconds (pacing keeps it under
# max_send_ahead_ms, 1500 by default).
LEAD_BUCKETS_MS = (0, 50, 100, 250, 500, 750, 1000, 1250, 1500, 2000, 3000, 6000)

ReadGauge = Callable[[], float | None]

__all__ = ["CONTENT_TYPE", "LEAD_BUCKETS_MS", "TTFA_BUCKETS_MS", "Metrics", "parse_exposition"]


class Metrics:
    """The server's metrics and their registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # The counters and histograms live here; the app's registry sees them without the
        # library's `_created` series.
        self._instruments = CollectorRegistry()
        self.registry.register(_WithoutCreated(self._instruments))
        self._gauges = _ScrapeGauges()
        self.registry.register(self._gauges)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

        self.contexts_total = self._counter(
            "streamtts_contexts_total",
            "Contexts (WebSocket) and speech requests (HTTP) ended, by reason.",
            "reason",
        )
        self.errors_total = self._counter(
            "streamtts_errors_total", "Errors sent to clients, by code.", "code"
        )
        self.rejected_total = self._counter(
            "streamtts_rejected_total",
            "Connections and requests refused before any work, by cause.",
            "cause",
        )
        self.ttfa_ms = self._histogram(
            "streamtts_ttfa_ms", "Server-side time to first audio, milliseconds.", TTFA_BUCKETS_MS
        )
        self.lead_ms = self._histogram(
            "streamtts_lead_ms",
            "Audio a streaming context had sent ahead of its listener's playback, milliseconds, "
            "at each audio frame.",
            LEAD_BUCKETS_MS,
        )
        self.late_audio_total = self._counter(
            "streamtts_late_audio_total",
            "Audio frames that reached the socket after their listener had run out of audio "
            "mid-utterance (underruns heard).",
        )
        self.late_audio_seconds_total = self._counter(
            "streamtts_late_audio_seconds_total",
            "Total length of the gaps before late audio frames, seconds.",
        )

    def gauge(self, name: str, help_text: str, read: ReadGauge) -> None:
        """Export ``read()`` as a gauge at every scrape (omitted while it returns None)."""
        self._gauges.add(name, help_text, read)

    def render(self) -> bytes:
        """The text exposition of every metric (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)

    def value(self, sample: str, **labels: str) -> float:
        """One sample's current value, 0 where it has none yet (e.g. an unseen label)."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found

    def _counter(self, name: str, help_text: str, label: str | None = None) -> Counter:
        labels = () if label is None else (label,)
        return Counter(name, help_text, labels, registry=self._instruments)

    def _histogram(self, name: str, help_text: str, buckets: Iterable[float]) -> Histogram:
        return Histogram(name, help_text, buckets=tuple(buckets), registry=self._instruments)


class _ScrapeGauges(Collector):
    """Gauges whose values are read from callbacks when Prometheus scrapes."""

    def __init__(self) -> None:
        self._gauges: dict[str, tuple[str, ReadGauge]] = {}

    def add(self, name: str, help_text: str, read: ReadGauge) -> None:
        if name in self._gauges:
            raise ValueError(f"gauge {name} is registered already")
        self._gauges[name] = (help_text, read)

    def describe(self) -> list[Metric]:
        return []  # the names change after registration; duplicates are refused in add()

    def collect(self) -> Iterator[Metric]:
        for name, (help_text, read) in self._gauges.items():
            value = read()
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)


class _WithoutCreated(Collector):
    """Another registry's metrics without the ``<name>_created`` samples."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            created = family.name + "_created"
            family.samples = [s for s in family.samples if s.name != created]
            yield family


def parse_exposition(text: str) -> dict[str, float]:
    """Sample name with labels → value. For tests and the soak check; comments skipped."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples
