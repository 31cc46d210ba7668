"""Metrics through prometheus-client: the exposition dashboards read (names, labels, types), no
``_created`` series, gauges read at scrape time, a registry per app, process metrics, and the
served /metrics equal to the table in docs/operations.md."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamtts.server.metrics import CONTENT_TYPE, Metrics, parse_exposition
from tests.app_server import serve_app
from tests.fake_engine import FakeEngine

OPERATIONS_MD = Path(__file__).parents[2] / "docs" / "operations.md"


def families(text: str) -> dict[str, str]:
    """Metric family name → type, parsed by the library's own parser (so the text is valid)."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_exposition_names_labels_and_values() -> None:
    metrics = Metrics()
    metrics.gauge("demo_gauge", "A gauge.", lambda: 3)
    metrics.gauge("absent_gauge", "Not there.", lambda: None)
    metrics.contexts_total.labels("end").inc()
    metrics.contexts_total.labels("end").inc()
    metrics.errors_total.labels('we"ird\ncode').inc()
    for value in (10, 60, 60, 7000):
        metrics.ttfa_ms.observe(value)
    text = metrics.render().decode()
    assert "# TYPE demo_gauge gauge\ndemo_gauge 3.0\n" in text
    assert "absent_gauge" not in text
    assert "# TYPE streamtts_contexts_total counter" in text
    assert "# TYPE streamtts_ttfa_ms histogram" in text
    samples = parse_exposition(text)
    assert samples['streamtts_contexts_total{reason="end"}'] == 2
    assert samples['streamtts_errors_total{code="we\\"ird\\ncode"}'] == 1
    # Buckets are cumulative; +Inf is the count.
    assert samples['streamtts_ttfa_ms_bucket{le="25.0"}'] == 1
    assert samples['streamtts_ttfa_ms_bucket{le="75.0"}'] == 3
    assert samples['streamtts_ttfa_ms_bucket{le="5000.0"}'] == 3
    assert samples['streamtts_ttfa_ms_bucket{le="+Inf"}'] == 4
    assert samples["streamtts_ttfa_ms_count"] == 4
    assert samples["streamtts_ttfa_ms_sum"] == 7130
    assert metrics.value("streamtts_contexts_total", reason="end") == 2
    assert metrics.value("streamtts_contexts_total", reason="never") == 0
    kinds = families(text)
    assert kinds["streamtts_contexts"] == "counter"  # the parser names counters without _total
    assert kinds["streamtts_ttfa_ms"] == "histogram"
    assert kinds["demo_gauge"] == "gauge"


def test_no_created_series() -> None:
    metrics = Metrics()
    metrics.contexts_total.labels("end").inc()
    metrics.rejected_total.labels("origin").inc()
    metrics.ttfa_ms.observe(100)
    text = metrics.render().decode()
    assert "streamtts_contexts_total" in text  # the filter keeps the counter itself
    assert "_created" not in text


def test_gauges_are_read_at_each_scrape() -> None:
    metrics = Metrics()
    box = {"value": 1.0}
    metrics.gauge("demo_live", "Read when scraped.", lambda: box["value"])
    assert parse_exposition(metrics.render().decode())["demo_live"] == 1
    box["value"] = 7.0
    assert parse_exposition(metrics.render().decode())["demo_live"] == 7
    with pytest.raises(ValueError, match="demo_live"):
        metrics.gauge("demo_live", "Twice.", lambda: 0.0)


def test_each_app_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.errors_total.labels("internal").inc()
    first.gauge("demo_only_first", "One registry.", lambda: 1.0)
    assert first.value("streamtts_errors_total", code="internal") == 1
    assert second.value("streamtts_errors_total", code="internal") == 0
    assert "demo_only_first" not in second.render().decode()


def test_process_and_python_metrics() -> None:
    samples = parse_exposition(Metrics().render().decode())
    assert samples["process_resident_memory_bytes"] > 0
    assert samples["process_open_fds"] > 0
    assert samples["process_cpu_seconds_total"] >= 0
    assert any(name.startswith("python_info{") for name in samples)
    assert any(name.startswith("python_gc_collections_total{") for name in samples)


def documented_metrics() -> dict[str, str]:
    """The metrics table of docs/operations.md: family name → type."""
    section = OPERATIONS_MD.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, str] = {}
    for row in re.findall(r"^\| (`streamtts_.*?) \| (\w+) \|", section, re.MULTILINE):
        for name in re.findall(r"`(streamtts_\w+)", row[0]):
            documented[name.removesuffix("_total")] = row[1]
    return documented


async def test_served_metrics_are_the_documented_ones() -> None:
    engine = FakeEngine(slots=2, realtime_streams=1.5)
    async with serve_app(engine, admit_by_capacity=True) as app, httpx.AsyncClient() as http:
        response = await http.get(app.url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    served = {n: t for n, t in families(response.text).items() if n.startswith("streamtts_")}
    assert served == documented_metrics()
    assert "_created" not in response.text
    assert {"process_resident_memory_bytes", "process_cpu_seconds"} <= set(families(response.text))
    samples = parse_exposition(response.text)
    assert samples["streamtts_realtime_capacity"] == 1.5
    assert samples["streamtts_admission_capacity"] == 1  # whole streams
    assert samples["streamtts_capacity_headroom"] == 1
    assert samples["streamtts_capacity_utilization"] == 0
