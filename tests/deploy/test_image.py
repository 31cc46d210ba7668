"""The CPU container image, run with podman: what it is (non-root, tini, health check, volumes,
labels, exactly the locked dependencies), that it speaks with no network at all (nothing is
downloaded at run time), and the real thing from outside the container: ready on /readyz, one
sentence over the native WebSocket with an API key given at run time, then SIGTERM in the middle
of an utterance — readiness drops, the utterance still finishes, the process exits 0. Then the
same image through deploy/compose.yaml (podman-compose).

Run by scripts/test-deploy, which builds the images and names them in STREAMTTS_TEST_IMAGE
(the default `full` target) and STREAMTTS_TEST_FISH_IMAGE (the `fish` target)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from packaging.utils import canonicalize_name
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.servers import free_port
from tests.ws_client import StreamClient

pytestmark = pytest.mark.deploy

REPO_DIR = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO_DIR / "deploy" / "docker"
API_KEY = "image-test-key-0123456789abcdef"
READY_TIMEOUT_S = 180.0
SENTENCE = "Hello from inside a container, spoken one sentence at a time."
GRACE_S = 30


def image(variable: str) -> str:
    name = os.environ.get(variable)
    assert name, f"{variable} is not set: run scripts/test-deploy, which builds the image"
    return name


@pytest.fixture(scope="module")
def full_image() -> str:
    return image("STREAMTTS_TEST_IMAGE")


@pytest.fixture(scope="module")
def fish_image() -> str:
    return image("STREAMTTS_TEST_FISH_IMAGE")


def podman(*args: str, check: bool = True, timeout_s: float = 300) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr}")
    return done.stdout


def inspect(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(podman("image", "inspect", name))[0]
    return found


def pins(lines: list[str]) -> set[str]:
    """name==version, the name normalised (pip freeze writes some with underscores)."""
    found = set()
    for line in lines:
        name, version = line.split("==")
        found.add(f"{canonicalize_name(name)}=={version}")
    return found


def locked(variant: str) -> set[str]:
    text = (DOCKER_DIR / f"requirements-{variant}.txt").read_text()
    return pins([line for line in text.splitlines() if line and not line.startswith("#")])


def installed(name: str) -> set[str]:
    frozen = podman(
        "run", "--rm", "--network", "none", "--entrypoint", "python3", name,
        "-m", "pip", "freeze", "--all",
    )  # fmt: skip
    return pins([line for line in frozen.splitlines() if not line.startswith("pip==")])


def torch_pin() -> str:
    match = re.search(r'torch_spec="torch==([^"]+)"', (REPO_DIR / "scripts/install").read_text())
    assert match
    return match.group(1)


@pytest.mark.parametrize(
    ("variable", "variant", "licenses"),
    [
        ("STREAMTTS_TEST_IMAGE", "cpu-full", "Apache-2.0 AND GPL-3.0-or-later"),
        ("STREAMTTS_TEST_FISH_IMAGE", "cpu-fish", "Apache-2.0"),
    ],
)
def test_image_config(variable: str, variant: str, licenses: str) -> None:
    found = inspect(image(variable))
    config = found["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"][:2] == ["tini", "--"]  # PID 1 forwards SIGTERM
    assert config["Cmd"] == ["serve"]
    assert set(config["Volumes"]) == {"/data/voices", "/cache"}
    assert set(config["ExposedPorts"]) == {"8000/tcp"}
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith("/cache/")
    assert env["STREAMTTS_HOST"] == "0.0.0.0"
    assert not [k for k in env if re.search("KEY|TOKEN|SECRET|PASSWORD|CERT", k)]  # none baked in
    assert found["Healthcheck"]["Test"] == ["CMD", "python3", "/app/healthcheck.py"]
    labels = config["Labels"]
    assert labels["io.streamtts.variant"] == variant
    assert labels["org.opencontainers.image.licenses"] == licenses
    history = json.dumps(found.get("History", []))
    assert "/opt/wheels" not in history and "ca-certificates.crt" not in history


@pytest.mark.parametrize(
    ("variable", "variant"),
    [("STREAMTTS_TEST_IMAGE", "full"), ("STREAMTTS_TEST_FISH_IMAGE", "fish")],
)
def test_image_holds_exactly_the_locked_dependencies(variable: str, variant: str) -> None:
    name = image(variable)
    found = installed(name)
    [torch] = [p for p in found if p.startswith("torch==")]
    assert torch.split("==")[1].split("+")[0] == torch_pin()
    assert found - {torch} == locked(variant)
    podman(
        "run", "--rm", "--network", "none", "--entrypoint", "python3", name, "-m", "pip", "check"
    )


def say_offline(name: str, *args: str) -> str:
    """`streamtts say` in a container with no network and a read-only root filesystem."""
    done = subprocess.run(
        ["podman", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
         name, "say", *args, "-o", "/tmp/out.wav"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_speaks_with_no_network(full_image: str) -> None:
    piper = say_offline(full_image, "Nothing is downloaded at run time.")
    assert re.search(r"wrote /tmp/out.wav \([1-9][0-9.]* s of audio", piper), piper
    fish = say_offline(full_image, "Fish runs here too.", "--model", "synthetic:tiny")
    assert re.search(r"wrote /tmp/out.wav \([0-9.]+ s of audio", fish), fish


def test_fish_image_has_no_gpl_code(fish_image: str) -> None:
    assert not [p for p in installed(fish_image) if p.startswith(("piper-tts==", "joe-us-"))]
    fish = say_offline(fish_image, "Fish only.", "--model", "synthetic:tiny")
    assert "wrote /tmp/out.wav" in fish


# In the image: pack a tiny model as `dtype auto` does on the CPU, then ask which decode ops run.
FUSED_OPS_PROBE = """
import shutil, torch
from streamtts.models.fish.fused import fused_decode_for
from streamtts.models.fish.llm.llama import fuse_gate_up_
from streamtts.models.fish.llm.synthetic import load_synthetic
from streamtts.models.fish.packed import pack_linears_
model = load_synthetic("tiny", torch.float32, "cpu", seed=1).model
fuse_gate_up_(model)
pack_linears_(model)
ops = fused_decode_for(model, enabled=True)
print(shutil.which("g++"), shutil.which("ninja"), ops.codebook_pass, ops.slow_step, sep="|")
"""


@pytest.mark.parametrize("variable", ["STREAMTTS_TEST_IMAGE", "STREAMTTS_TEST_FISH_IMAGE"])
def test_the_fused_ops_come_built(variable: str) -> None:
    """No compiler in the image, yet the fused decode ops run: built at image build time and
    loaded from TORCH_EXTENSIONS_DIR under a read-only root, with no network. (ninja is there,
    a dependency of the fish extra, and builds nothing without a compiler.)"""
    probe = podman(
        "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
        "--entrypoint", "python3", image(variable), "-c", FUSED_OPS_PROBE,
    )  # fmt: skip
    assert probe.strip().splitlines()[-1] == "None|/opt/venv/bin/ninja|fused|fused", probe


def healthy(container: str) -> bool:
    """The image's HEALTHCHECK, run now (this machine has no systemd to run it on a timer)."""
    return subprocess.run(["podman", "healthcheck", "run", container], check=False).returncode == 0


class Container:
    """A detached container publishing its port 8000 on 127.0.0.1."""

    def __init__(self, name: str, port: int) -> None:
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        started = time.monotonic()
        reported = started
        while time.monotonic() - started < timeout_s:
            if podman("inspect", "--format", "{{.State.Running}}", self.name).strip() != "true":
                raise AssertionError(f"container exited:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() - reported > 10:
                reported = time.monotonic()
                print(
                    f"  waiting for {self.name} /readyz ({reported - started:.0f} s)",
                    file=sys.stderr,
                )
            time.sleep(0.5)
        raise AssertionError(f"not ready in {timeout_s} s:\n{self.logs()}")

    def logs(self) -> str:
        done = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True)
        return done.stdout + done.stderr

    def exit_code(self, timeout_s: float) -> int:
        return int(podman("wait", self.name, timeout_s=timeout_s).strip())


@pytest.fixture
def server(full_image: str) -> Iterator[Container]:
    """The image run as the chart runs it: read-only root, writable /tmp and /cache only, no
    capabilities, no privilege escalation; the API key given at run time."""
    port = free_port()
    name = f"streamtts-test-{port}"
    podman(
        "run", "--detach", "--name", name, "--publish", f"127.0.0.1:{port}:8000",
        "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--env", f"STREAMTTS_API_KEYS={API_KEY}",
        "--env", f"STREAMTTS_SHUTDOWN_GRACE_S={GRACE_S}",
        full_image,
    )  # fmt: skip
    try:
        yield Container(name, port)
    finally:
        podman("rm", "--force", "--volumes", name, check=False)


async def open_client(container: Container) -> StreamClient:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    ws_url = container.url.replace("http://", "ws://") + "/v1/stream"
    return StreamClient(await connect(ws_url, additional_headers=headers, max_size=None))


async def test_serves_speaks_and_drains_on_sigterm(server: Container) -> None:
    server.wait_ready()
    assert healthy(server.name)
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/metrics")).status_code == 401  # the key given at run time
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert (await http.get("/metrics", headers=auth)).status_code == 200

        client = await open_client(server)
        spoken = await client.speak("one", SENTENCE)
        assert spoken.done is not None and spoken.done["reason"] == "end", spoken.messages
        assert len(spoken.audio) > 24_000 * 2  # more than a second of 24 kHz s16le

        # An utterance in flight when the orchestrator sends SIGTERM.
        fmt = {"encoding": "pcm_s16le", "sample_rate": 24000}
        await client.send(type="start", context="two", format=fmt)
        await client.send(type="text", context="two", text="This sentence starts before ")
        await client.send(type="flush", context="two")
        while not client.contexts["two"].audio:  # speaking
            await client.receive_one()
        podman("kill", "--signal", "TERM", server.name)
        ready = await http.get("/readyz")
        deadline = time.monotonic() + 10
        while ready.status_code == 200 and time.monotonic() < deadline:
            ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["draining"] is True
        await client.send(type="text", context="two", text="the signal and ends after it.")
        await client.send(type="end", context="two")
        finished = await client.until_done("two", timeout_s=GRACE_S)
        assert finished.done is not None and finished.done["reason"] == "end"
        assert len(finished.audio) > 24_000
        with pytest.raises(ConnectionClosed):  # drained: the server closes the socket
            while True:
                await client.receive_one(timeout_s=GRACE_S)
    assert server.exit_code(timeout_s=GRACE_S + 15) == 0
    logs = server.logs()
    assert "draining: 1 contexts in flight" in logs, logs
    assert "Traceback" not in logs, logs


def compose(project_dir: Path, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "podman-compose"), "-p", "streamtts-test",
         "-f", str(project_dir / "compose.yaml"), *args],
        capture_output=True, text=True, timeout=180, check=False, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, f"podman-compose {args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_compose_runs_the_server(full_image: str, tmp_path: Path) -> None:
    """deploy/compose.yaml as an operator uses it: the key from an env file, volumes, the
    health check, a read-only root; `stop` drains and exits 0."""
    shutil.copy(REPO_DIR / "deploy" / "compose.yaml", tmp_path / "compose.yaml")
    (tmp_path / "streamtts.env").write_text(f"STREAMTTS_API_KEYS={API_KEY}\n")
    (tmp_path / "models").mkdir()
    port = free_port()
    env = {"STREAMTTS_IMAGE": full_image, "STREAMTTS_PUBLISH": f"127.0.0.1:{port}"}
    compose(tmp_path, "up", "--detach", "--no-build", "streamtts", env=env)
    container = Container("streamtts-test_streamtts_1", port)
    try:
        container.wait_ready()
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert httpx.get(container.url + "/metrics", timeout=5).status_code == 401
        assert httpx.get(container.url + "/metrics", headers=auth, timeout=5).status_code == 200
        settings = json.loads(podman("inspect", container.name))[0]
        assert settings["HostConfig"]["ReadonlyRootfs"] is True
        mounts = {m["Destination"]: m for m in settings["Mounts"]}
        assert {"/data/voices", "/cache", "/models"} <= set(mounts)
        assert mounts["/models"]["RW"] is False
        assert healthy(container.name)
        compose(tmp_path, "stop", "streamtts", env=env)
        assert podman("inspect", "--format", "{{.State.ExitCode}}", container.name).strip() == "0"
        assert "draining: 0 contexts in flight" in container.logs()
    finally:
        compose(tmp_path, "down", "--volumes", env=env)
