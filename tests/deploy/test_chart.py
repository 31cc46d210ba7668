"""The Helm chart, rendered by real Helm (the Go SDK inside ``helm-python-sdk``) for a matrix of
values (defaults and every ``ci/*-values.yaml``), each manifest validated against Kubernetes'
own schemas with ``kubernetes-validate --strict`` (CRDs, which it has no schema for, by
structure), bad values refused, and what the chart promises checked on the output: probes,
drain timing, security, GPU scheduling, autoscaling, secrets, ingress.

Run by scripts/test-deploy (``pytest -m deploy tests/deploy``): needs the ``deploy`` extras,
imported only when a test runs, so the main suite (which deselects these) collects the module
without them."""

from __future__ import annotations

import base64
import importlib.util
import json
import tomllib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from streamtts.config import ENV_PREFIX, Settings

if TYPE_CHECKING:
    import helm_python

pytestmark = pytest.mark.deploy

REPO_DIR = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_DIR / "deploy" / "helm" / "streamtts"
ADAPTER_VALUES = REPO_DIR / "deploy" / "helm" / "prometheus-adapter-values.yaml"
RELEASE, NAMESPACE = "tts", "voice"
FULLNAME = "tts-streamtts"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion); the newest schemas too.
OLDEST_KUBE_VERSION = "1.27"
# Custom resources: no schema in kubernetes-validate; checked by structure below.
CRDS = {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "ServiceMonitor")}

MATRIX: dict[str, dict[str, Any]] = {"defaults": {}} | {
    path.name.removesuffix("-values.yaml"): yaml.safe_load(path.read_text())
    for path in sorted((CHART_DIR / "ci").glob("*-values.yaml"))
}


def helm() -> ModuleType:
    import helm_python

    return helm_python


def schema_validator() -> Any:
    """An independent JSON-schema validator for the chart's schema (not Helm's)."""
    import jsonschema

    return jsonschema.Draft7Validator(chart_schema())


@pytest.fixture(scope="module")
def chart() -> helm_python.Chart:
    found: helm_python.Chart = helm().Chart.load(CHART_DIR)
    return found


def render(chart: helm_python.Chart, values: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """(kind, name) → manifest; NOTES.txt as ("NOTES", "")."""
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    manifests: dict[tuple[str, str], Any] = {}
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            manifests[("NOTES", "")] = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in manifests, f"{key} rendered twice"
                manifests[key] = doc
    return manifests


def container(manifests: dict[tuple[str, str], Any]) -> dict[str, Any]:
    pod = manifests[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    found: dict[str, Any] = pod["containers"][0]
    return found


def env_of(manifests: dict[tuple[str, str], Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(manifests)["env"] if "value" in e}


@pytest.mark.parametrize("case", MATRIX)
def test_renders_and_validates_strictly(chart: helm_python.Chart, case: str) -> None:
    import kubernetes_validate

    versions = (OLDEST_KUBE_VERSION, kubernetes_validate.utils.latest_version())
    manifests = render(chart, MATRIX[case])
    kinds = {kind for kind, _ in manifests}
    assert {"Deployment", "Service", "NOTES"} <= kinds
    for (kind, _name), manifest in manifests.items():
        if kind == "NOTES":
            continue
        assert manifest["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        if (manifest["apiVersion"], kind) in CRDS:
            continue
        for version in versions:
            # Raises ValidationError naming the path of a misspelt or ill-typed field.
            kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("case", MATRIX)
def test_lint_is_clean(case: str) -> None:
    report = helm().lint(CHART_DIR, MATRIX[case], strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


@pytest.mark.parametrize("case", MATRIX)
def test_server_accepts_the_rendered_settings(chart: helm_python.Chart, case: str) -> None:
    env = env_of(render(chart, MATRIX[case]))
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
    assert settings.host == "0.0.0.0" and settings.port == 8000
    assert settings.model == MATRIX[case].get("model", "piper")


def test_defaults(chart: helm_python.Chart) -> None:
    manifests = render(chart, {})
    deployment = manifests[("Deployment", FULLNAME)]
    pod = deployment["spec"]["template"]["spec"]
    main = container(manifests)
    env = env_of(manifests)
    assert main["image"] == "streamtts:0.1.0-cpu"
    assert main["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    startup = main["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # load + cold compile
    # Drain: the pod outlives preStop + the server's grace; both come from one set of values.
    grace_s = float(env["STREAMTTS_SHUTDOWN_GRACE_S"])
    pre_stop_s = float(main["lifecycle"]["preStop"]["exec"]["command"][1])
    assert grace_s >= 30 and pre_stop_s > 0
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + grace_s
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # Non-root, read-only root filesystem, writable /tmp and /cache only.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert {"/tmp", "/cache", "/data/voices", "/run/secrets/streamtts"} <= set(mounts)
    assert mounts["/run/secrets/streamtts"]["readOnly"] is True
    assert "nvidia.com/gpu" not in main["resources"].get("limits", {})
    assert "cpu" not in main["resources"]["limits"]  # no CPU throttling of real-time audio
    assert env["STREAMTTS_API_KEY_FILE"] == "/run/secrets/streamtts/api-keys"
    assert env["STREAMTTS_CPU_THREADS"] == "2"
    voices = manifests[("PersistentVolumeClaim", f"{FULLNAME}-voices")]
    assert voices["spec"]["accessModes"] == ["ReadWriteMany"]  # shared by every replica
    assert manifests[("PodDisruptionBudget", FULLNAME)]["spec"]["maxUnavailable"] == 1
    service = manifests[("Service", FULLNAME)]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert not {"HorizontalPodAutoscaler", "ScaledObject", "Ingress", "ServiceMonitor"} & {
        kind for kind, _ in manifests
    }


def secret_keys(manifests: dict[tuple[str, str], Any], key: str) -> list[str]:
    data = manifests[("Secret", f"{FULLNAME}-api-keys")]["data"]
    return base64.b64decode(data[key]).decode().splitlines()


def test_created_secret(chart: helm_python.Chart) -> None:
    generated = render(chart, {})
    keys = secret_keys(generated, "api-keys")
    scrape = secret_keys(generated, "scrape-key")
    assert len(keys) == 2 and len(set(keys)) == 2 and all(len(k) == 48 for k in keys)
    assert scrape == keys[-1:]  # Prometheus has a key of its own, also accepted by the server
    given = render(chart, {"auth": {"apiKeys": ["client-key-0123456789"]}})
    assert secret_keys(given, "api-keys")[0] == "client-key-0123456789"
    assert len(secret_keys(given, "api-keys")) == 2


def test_existing_secret(chart: helm_python.Chart) -> None:
    manifests = render(chart, MATRIX["existing-secret"])
    assert not [kind for kind, _ in manifests if kind == "Secret"]
    pod = manifests[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    secret = next(v["secret"] for v in pod["volumes"] if "secret" in v)
    assert secret["secretName"] == "streamtts-keys"
    assert secret["items"] == [{"key": "keys.txt", "path": "api-keys"}]
    claim = next(v for v in pod["volumes"] if v["name"] == "voices")
    assert claim["persistentVolumeClaim"]["claimName"] == "shared-voices"
    assert ("PersistentVolumeClaim", f"{FULLNAME}-voices") not in manifests
    monitor = manifests[("ServiceMonitor", FULLNAME)]
    auth = monitor["spec"]["endpoints"][0]["authorization"]
    assert auth == {
        "type": "Bearer",
        "credentials": {"name": "streamtts-keys", "key": "prometheus-key"},
    }


def test_gpu(chart: helm_python.Chart) -> None:
    manifests = render(chart, MATRIX["gpu"])
    pod = manifests[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    main = container(manifests)
    env = env_of(manifests)
    assert main["image"] == "streamtts:0.1.0-cuda"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert main["resources"]["limits"]["memory"] == "16Gi"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert env["STREAMTTS_DEVICE"] == "cuda" and env["STREAMTTS_COMPILE"] == "true"
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert models["persistentVolumeClaim"] == {"claimName": "fish-checkpoints", "readOnly": True}
    cache = manifests[("PersistentVolumeClaim", f"{FULLNAME}-compile-cache")]
    assert cache["spec"]["storageClassName"] == "fast-ssd"
    cache_volume = next(v for v in pod["volumes"] if v["name"] == "cache")
    assert cache_volume["persistentVolumeClaim"]["claimName"] == f"{FULLNAME}-compile-cache"


def test_hpa_scales_on_live_streams(chart: helm_python.Chart) -> None:
    manifests = render(chart, MATRIX["hpa"])
    assert "replicas" not in manifests[("Deployment", FULLNAME)]["spec"]  # the HPA owns it
    hpa = manifests[("HorizontalPodAutoscaler", FULLNAME)]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": FULLNAME,
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 10)
    [metric] = hpa["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "streamtts_active_contexts"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "24"}
    down = hpa["behavior"]["scaleDown"]
    # Slow scale-down, one pod at a time: each removed pod drains its streams first.
    assert down["stabilizationWindowSeconds"] >= 300
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
    check_service_monitor(
        manifests[("ServiceMonitor", FULLNAME)], {"release": "kube-prometheus-stack"}
    )
    # The adapter example serves exactly the metric the HPA asks for, per pod.
    rules = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    served = {rule["name"]["as"]: rule for rule in rules}
    rule = served[metric["pods"]["metric"]["name"]]
    assert "streamtts_active_contexts" in rule["seriesQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}

    # By default the HPA scales on the capacity the pods measure of themselves, and the adapter
    # serves that too.
    default = render(chart, {"autoscaling": {"enabled": True}})
    [metric] = default[("HorizontalPodAutoscaler", FULLNAME)]["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "streamtts_capacity_utilization"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "0.7"}
    assert "streamtts_capacity_utilization" in served


def check_service_monitor(monitor: dict[str, Any], labels: dict[str, str]) -> None:
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert labels.items() <= monitor["metadata"]["labels"].items()
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "streamtts",
        "app.kubernetes.io/instance": RELEASE,
    }
    [endpoint] = spec["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["type"] == "Bearer"  # /metrics needs a key
    assert set(spec) == {"selector", "endpoints"}
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "authorization"}


def test_keda_scaled_object(chart: helm_python.Chart) -> None:
    manifests = render(chart, MATRIX["keda"])
    assert ("HorizontalPodAutoscaler", FULLNAME) not in manifests  # KEDA makes its own
    scaled = manifests[("ScaledObject", FULLNAME)]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) == {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "advanced",
        "triggers",
    }
    assert spec["scaleTargetRef"]["name"] == FULLNAME
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 6)
    assert isinstance(spec["pollingInterval"], int) and spec["cooldownPeriod"] == 600
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["policies"][0]["value"] == 1
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    metadata = trigger["metadata"]
    assert all(isinstance(v, str) for v in metadata.values())  # KEDA wants strings here
    assert metadata["threshold"] == "16.5"
    assert metadata["query"] == (
        f'sum(streamtts_active_contexts{{namespace="{NAMESPACE}",service="{FULLNAME}"}})'
    )
    assert metadata["serverAddress"].startswith("http://")


def test_ingress_for_websockets(chart: helm_python.Chart) -> None:
    manifests = render(chart, MATRIX["ingress"])
    ingress = manifests[("Ingress", FULLNAME)]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "7200"
    assert annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"] == "7200"
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert annotations["cert-manager.io/cluster-issuer"] == "letsencrypt"
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"secretName": "tts-example-org-tls", "hosts": ["tts.example.org"]}]
    [rule] = spec["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": FULLNAME, "port": {"name": "http"}}
    assert env_of(manifests)["STREAMTTS_ALLOWED_ORIGINS"] == "https://app.example.org"
    assert manifests[("Deployment", FULLNAME)]["spec"]["replicas"] == 3
    assert "wss://tts.example.org/v1/stream" in manifests[("NOTES", "")]
    plain = render(
        chart, {**MATRIX["ingress"], "ingress": {**MATRIX["ingress"]["ingress"], "nginx": False}}
    )
    assert (
        "nginx.ingress.kubernetes.io/proxy-buffering"
        not in plain[("Ingress", FULLNAME)]["metadata"]["annotations"]
    )


def test_settings_become_environment_strings(chart: helm_python.Chart) -> None:
    values = {"settings": {"MAX_WS_MESSAGE_BYTES": 1048576.0, "MAX_LEAD_S": 2.5, "COMPILE": True}}
    env = env_of(render(chart, values))
    assert env["STREAMTTS_MAX_WS_MESSAGE_BYTES"] == "1048576"  # not 1.048576e+06
    assert env["STREAMTTS_MAX_LEAD_S"] == "2.5" and env["STREAMTTS_COMPILE"] == "true"
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
    assert settings.limits.max_ws_message_bytes == 1048576 and settings.fish.compile is True


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"settings": {"MAX_STRAMS": 4}}, "MAX_STRAMS"),  # misspelt setting
    ({"settings": {"MAX_STREAMS": "four"}}, "/settings/MAX_STREAMS"),
    ({"settings": {"PORT": 9000}}, "PORT"),  # the chart owns it
    ({"settings": {"MAX_ACTIVE_CONTEXTS": -1}}, "/settings/MAX_ACTIVE_CONTEXTS"),
    ({"replicas": 2}, "replicas"),  # unknown top-level value
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"shutdown": {"graceSeconds": 0}}, "/shutdown/graceSeconds"),
    ({"autoscaling": {"kind": "vpa"}}, "/autoscaling/kind"),
    ({"autoscaling": {"metric": {"targetAverageValue": 0}}}, "targetAverageValue"),
    ({"autoscaling": {"metric": {"name": "bad name"}}}, "/autoscaling/metric/name"),
    ({"auth": {"apiKeys": ["has space in it, too short"]}}, "/auth/apiKeys"),
    ({"voices": {"persistence": {"accessModes": ["ReadWriteSometimes"]}}}, "accessModes"),
    ({"resources": {"requests": {"cpu": "two"}}}, "/resources/requests/cpu"),
    ({"gpu": {"count": 0}}, "/gpu/count"),
    ({"ingress": {"hosts": [{"host": "a.example", "paths": [{"path": "x"}]}]}}, "/ingress/hosts"),
    ({"extraEnv": [{"name": "STREAMTTS_MODEL", "value": "x"}]}, "/extraEnv/0/name"),
    ({"serviceMonitor": {"interval": "often"}}, "/serviceMonitor/interval"),
    ({"wyoming": {"port": 8000}}, "/wyoming/port"),  # the HTTP port
    ({"wyoming": {"port": "10200"}}, "/wyoming/port"),
    ({"settings": {"WYOMING_PORT": 10200}}, "WYOMING_PORT"),  # the chart owns it
    ({"tls": {"secret": "x"}}, "/tls"),
]
BAD_COMBINATIONS: list[tuple[dict[str, Any], str]] = [
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "maxReplicas must be >= "),
    ({"gpu": {"enabled": True}}, "serves Fish-Speech only"),
    ({"auth": {"enabled": False, "existingSecret": "keys"}}, "auth.enabled is false"),
]


@pytest.mark.parametrize(("values", "names"), BAD_VALUES)
def test_schema_refuses_bad_values(
    chart: helm_python.Chart, values: dict[str, Any], names: str
) -> None:
    with pytest.raises(helm().HelmValuesError, match="schema") as refused:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert names in str(refused.value)
    # The schema itself says no, not only Helm's reading of it: an independent validator.
    merged = chart.merge_values(values)
    assert list(schema_validator().iter_errors(merged))


@pytest.mark.parametrize(("values", "message"), BAD_COMBINATIONS)
def test_templates_refuse_bad_combinations(
    chart: helm_python.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm().HelmRenderError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def chart_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return schema


@pytest.mark.parametrize("case", MATRIX)
def test_good_values_pass_an_independent_validator(chart: helm_python.Chart, case: str) -> None:
    schema_validator().validate(chart.merge_values(MATRIX[case]))


def test_schema_is_valid_and_lists_every_server_setting() -> None:
    import jsonschema

    schema = chart_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    spec = importlib.util.spec_from_file_location(
        "chart_schema", REPO_DIR / "scripts" / "chart_schema.py"
    )
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert schema["properties"]["settings"] == generator.settings_schema(), (
        "settings changed: run .venv/bin/python scripts/chart_schema.py"
    )


def test_chart_version_is_the_package_version() -> None:
    chart_yaml = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    pyproject = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())
    assert chart_yaml["appVersion"] == pyproject["project"]["version"]


def test_wyoming_port_and_tls(chart: helm_python.Chart) -> None:
    manifests = render(chart, MATRIX["wyoming-tls"])
    env = env_of(manifests)
    assert env["STREAMTTS_WYOMING_PORT"] == "10200" and env["STREAMTTS_WYOMING_HOST"] == "0.0.0.0"
    assert env["STREAMTTS_WYOMING_ZEROCONF"] == "false"
    assert env["STREAMTTS_SSL_CERTFILE"] == "/run/secrets/streamtts-tls/tls.crt"
    assert env["STREAMTTS_SSL_KEYFILE"] == "/run/secrets/streamtts-tls/tls.key"
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
    assert settings.wyoming.enabled and settings.tls
    main = container(manifests)
    assert {"name": "wyoming", "containerPort": 10200, "protocol": "TCP"} in main["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"]["scheme"] == "HTTPS", probe
    mounts = {m["name"]: m for m in main["volumeMounts"]}
    assert mounts["tls"]["mountPath"] == "/run/secrets/streamtts-tls" and mounts["tls"]["readOnly"]
    pod = manifests[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "streamtts-tls"
    ports = manifests[("Service", FULLNAME)]["spec"]["ports"]
    assert {"name": "wyoming", "port": 10200, "targetPort": "wyoming", "protocol": "TCP"} in ports

    plain = render(chart, {})
    assert "STREAMTTS_WYOMING_PORT" not in env_of(plain)
    assert "STREAMTTS_SSL_CERTFILE" not in env_of(plain)
    assert container(plain)["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert [p["name"] for p in manifests[("Service", FULLNAME)]["spec"]["ports"]][0] == "http"
    assert [p["name"] for p in plain[("Service", FULLNAME)]["spec"]["ports"]] == ["http"]
