"""``streamtts serve --ssl-certfile F --ssl-keyfile K``: https:// and wss:// with a self-signed
certificate (an IP SAN for 127.0.0.1, made at test time), the bundled voice, and the ElevenLabs
SDK, which only ever connects with wss://, trusting it through ``SSL_CERT_FILE``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from loadtest.compat import run_client
from loadtest.tls import Certificate, self_signed
from streamtts.audio import decode_samples
from tests.servers import ServerProcess


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(certificate: Certificate) -> Iterator[ServerProcess]:
    server = ServerProcess(certfile=certificate.certfile, keyfile=certificate.keyfile)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_the_server_speaks_https_with_its_certificate(
    tls_server: ServerProcess, certificate: Certificate
) -> None:
    assert tls_server.url.startswith("https://")
    response = httpx.get(tls_server.url + "/v1/voices", verify=tls_server.verify())
    assert response.status_code == 200
    with pytest.raises(httpx.ConnectError):  # not trusted without the certificate
        httpx.get(tls_server.url + "/healthz")


async def test_elevenlabs_sdk_speaks_the_bundled_voice_over_wss(
    tls_server: ServerProcess, certificate: Certificate, tmp_path: Path
) -> None:
    out = tmp_path / "speech.pcm"
    events = await run_client(
        "elevenlabs_sdk",
        ["--base-url", tls_server.url, "--format", "pcm_16000", "--out", str(out)],
        env={"SSL_CERT_FILE": str(certificate.certfile)},
    )
    samples = decode_samples(out.read_bytes(), "pcm_s16le")
    assert 4.0 < samples.size / 16000 < 30.0  # three sentences of speech
    assert float(np.sqrt(np.mean(samples**2))) > 0.02
    audio = [e for e in events if e["event"] == "audio"]
    [text_end] = [e for e in events if e["event"] == "text_end"]
    assert audio[0]["t"] < text_end["t"]  # the first sentence spoke while tokens came
