"""Prometheus metrics, written in the text exposition format (version 0.0.4) by hand.

A few counters, gauges and one histogram are all the server needs; no client library. Every
metric lives in one :class:`Metrics` object per app, so tests and several apps in one process
never share state. All updates happen on the event loop (no locks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Time to first audio, milliseconds.
TTFA_BUCKETS_MS = (25, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Counter:
    """A counter with at most one label."""

    def __init__(self, name: str, help_text: str, label: str | None = None) -> None:
        self.name, self.help, self.label = name, help_text, label
        self._values: dict[str, float] = {}

    def inc(self, label_value: str = "", amount: float = 1.0) -> None:
        self._values[label_value] = self._values.get(label_value, 0.0) + amount

    def value(self, label_value: str = "") -> float:
        return self._values.get(label_value, 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        values = self._values if self._values or self.label else {"": 0.0}
        for key, value in sorted(values.items()):
            labels = _labels([(self.label, key)] if self.label else [])
            lines.append(f"{self.name}{labels} {_number(value)}")
        return lines


class Gauge:
    """A gauge read from a callback at scrape time (so it can never drift from the truth)."""

    def __init__(self, name: str, help_text: str, read: Callable[[], float | None]) -> None:
        self.name, self.help, self._read = name, help_text, read

    def render(self) -> list[str]:
        value = self._read()
        if value is None:
            return []
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} gauge",
            f"{self.name} {_number(value)}",
        ]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Iterable[float]) -> None:
        self.name, self.help = name, help_text
        self.buckets = tuple(sorted(buckets))
        self._counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self._counts[i] += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for bound, count in zip(self.buckets, self._counts, strict=True):
            lines.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {count}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum {_number(self.sum)}")
        lines.append(f"{self.name}_count {self.count}")
        return lines


class Metrics:
    """The server's metrics. Gauges are registered by the parts that own the numbers."""

    def __init__(self) -> None:
        self.contexts_total = Counter(
            "streamtts_contexts_total",
            "Contexts (WebSocket) and speech requests (HTTP) ended, by reason.",
            "reason",
        )
        self.errors_total = Counter(
            "streamtts_errors_total", "Errors sent to clients, by code.", "code"
        )
        self.rejected_total = Counter(
            "streamtts_rejected_total",
            "Connections and requests refused before any work, by cause.",
            "cause",
        )
        self.ttfa_ms = Histogram(
            "streamtts_ttfa_ms", "Server-side time to first audio, milliseconds.", TTFA_BUCKETS_MS
        )
        self._gauges: list[Gauge] = []

    def gauge(self, name: str, help_text: str, read: Callable[[], float | None]) -> None:
        self._gauges.append(Gauge(name, help_text, read))

    def render(self) -> str:
        lines: list[str] = []
        for gauge in self._gauges:
            lines += gauge.render()
        for metric in (self.contexts_total, self.errors_total, self.rejected_total, self.ttfa_ms):
            lines += metric.render()
        return "\n".join(lines) + "\n"


def parse_exposition(text: str) -> dict[str, float]:
    """Sample name with labels → value. For tests and the soak check; comments skipped."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples
