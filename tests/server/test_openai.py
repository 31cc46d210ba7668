"""OpenAI-compatible HTTP API, exercised with the official `openai` SDK and plain HTTP."""

from __future__ import annotations

import io

import av
import httpx
import numpy as np
import openai
import pytest

TEXT = "Hello from the streaming server. This is the second sentence."


@pytest.fixture
def client(live_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server + "/v1", api_key="not-needed", max_retries=0)


def test_sdk_streams_pcm_with_streaming_response(client: openai.OpenAI) -> None:
    chunks: list[bytes] = []
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "application/octet-stream"  # as OpenAI
        chunks.extend(response.iter_bytes(chunk_size=4096))
    pcm = b"".join(chunks)
    assert len(pcm) % 2 == 0
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    seconds = samples.size / 24000  # OpenAI's pcm is 24 kHz s16le mono
    assert 2.0 < seconds < 10.0
    assert float(np.sqrt(np.mean(samples**2))) > 0.02
    assert len(chunks) > 1  # it streamed rather than arriving as one blob


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac", "aac"])
def test_container_formats_decode_to_speech_length_audio(client: openai.OpenAI, fmt: str) -> None:
    response = client.audio.speech.create(
        model="tts-1", voice="nova", input="Short test sentence.", response_format=fmt
    )
    data = response.read()
    with av.open(io.BytesIO(data)) as container:
        rate_hz = container.streams.audio[0].rate
        frames = [f.to_ndarray() for f in container.decode(audio=0)]
    seconds = sum(f.shape[-1] for f in frames) / rate_hz
    assert 0.8 < seconds < 5.0, seconds


def test_models_and_voices(live_server: str, client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {"tts-1", "piper"} <= ids
    voices = httpx.get(live_server + "/v1/voices").json()
    assert voices["default"] in {v["id"] for v in voices["voices"]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tts-1", "voice": "alloy"}, "input"),
        ({"model": "tts-1", "voice": "alloy", "input": "x" * 5000}, "input"),
        (
            {"model": "tts-1", "voice": "alloy", "input": "hi", "response_format": "ogg"},
            "response_format",
        ),
        ({"model": "tts-1", "voice": "alloy", "input": "hi", "speed": 10}, "speed"),
        ({"model": "tts-1", "voice": "nobody", "input": "hi"}, "voice"),
    ],
)
def test_bad_requests_get_openai_errors(
    live_server: str, body: dict[str, object], param: str | None
) -> None:
    response = httpx.post(live_server + "/v1/audio/speech", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    if param is not None:
        assert error["param"] == param


def test_sdk_raises_bad_request_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model="tts-1", voice="alloy", input="", response_format="pcm")


def test_health_and_readiness(live_server: str) -> None:
    assert httpx.get(live_server + "/healthz").status_code == 200
    ready = httpx.get(live_server + "/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
