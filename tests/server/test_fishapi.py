"""The Fish Audio API with both modules of the official ``fish-audio-sdk`` (the new
``fishaudio`` and the legacy ``fish_audio_sdk``), unmodified, pointed at a real server with the
bundled voice: ``POST /v1/tts`` and the ``/v1/tts/live`` WebSocket, every format, options,
errors as each SDK raises them."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator

import av
import fish_audio_sdk as legacy
import numpy as np
import pytest
from fishaudio import FishAudio, ReferenceAudio, TTSConfig
from fishaudio.exceptions import APIError, WebSocketError

from tests.piper_speed import SPEED_2_DURATION_RATIO

TEXT = "Hello from the Fish Audio API. This is the second sentence."
PIPER_RATE_HZ = 22_050
WAIT_S = 60.0


@pytest.fixture(scope="module")
def client(live_server: str) -> Iterator[FishAudio]:
    client = FishAudio(api_key="unused", base_url=live_server)
    yield client
    client.close()


@pytest.fixture(scope="module")
def session(live_server: str) -> legacy.Session:
    return legacy.Session("unused", base_url=live_server)


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        rate_hz = container.streams.audio[0].rate
        return sum(f.samples for f in container.decode(audio=0)) / rate_hz


def pcm_seconds(pcm: bytes, rate_hz: int) -> float:
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32767
    assert float(np.sqrt(np.mean(samples**2))) > 0.02  # speech, not silence
    return samples.size / rate_hz


# ---- POST /v1/tts ---------------------------------------------------------------------------


def test_legacy_session_streams_the_body_as_it_is_made(session: legacy.Session) -> None:
    chunks = list(session.tts(legacy.TTSRequest(text=TEXT, format="pcm")))
    assert len(chunks) > 1  # a chunked body, read as it comes (the legacy SDK streams)
    assert 3.0 < pcm_seconds(b"".join(chunks), PIPER_RATE_HZ) < 9.0


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus"])
def test_new_sdk_every_container_format_decodes(client: FishAudio, fmt: str) -> None:
    audio = client.tts.convert(text=TEXT, format=fmt)
    assert 3.0 < decoded_seconds(audio) < 9.0


def test_sample_rate_and_speed_are_honoured(client: FishAudio, session: legacy.Session) -> None:
    normal = client.tts.convert(text=TEXT, config=TTSConfig(format="pcm", sample_rate=16_000))
    fast = client.tts.convert(
        text=TEXT, speed=2.0, config=TTSConfig(format="pcm", sample_rate=16_000)
    )
    normal_s, fast_s = pcm_seconds(normal, 16_000), pcm_seconds(fast, 16_000)
    low, high = SPEED_2_DURATION_RATIO
    assert low < fast_s / normal_s < high
    legacy_body = b"".join(
        session.tts(legacy.TTSRequest(text=TEXT, format="pcm", sample_rate=16_000))
    )
    assert 0.8 < pcm_seconds(legacy_body, 16_000) / normal_s < 1.25


def test_errors_are_raised_by_each_sdk_with_the_status_and_message(
    client: FishAudio, session: legacy.Session
) -> None:
    with pytest.raises(APIError) as new_error:
        client.tts.convert(text="Hi.", reference_id="nobody")
    assert new_error.value.status == 400 and "reference_id" in new_error.value.message
    with pytest.raises(APIError) as refused:
        client.tts.convert(text="Hi.", config=TTSConfig(top_p=0.5))  # Piper has no top_p
    assert refused.value.status == 400 and "top_p" in refused.value.message
    with pytest.raises(APIError) as references:
        client.tts.convert(text="Hi.", references=[ReferenceAudio(audio=b"RIFF", text="hi")])
    assert references.value.status == 400 and "references" in references.value.message
    with pytest.raises(legacy.HttpCodeErr) as old_error:
        list(session.tts(legacy.TTSRequest(text="")))
    assert old_error.value.status == 400


# ---- GET /v1/tts/live -----------------------------------------------------------------------


class LlmText:
    """Text deltas sent from the SDK's sender thread; the second sentence waits until audio has
    arrived (or a long time, and the test fails), so audio must come before ``stop``."""

    def __init__(self) -> None:
        self.first_audio = threading.Event()
        self.stop_s: float | None = None

    def __iter__(self) -> Iterator[str]:
        yield from ["Hello from", " the live", " socket of", " the Fish API.", " And then"]
        self.first_audio.wait(WAIT_S)
        yield from [" a second", " sentence."]
        self.stop_s = time.perf_counter()


def collect(chunks: Iterator[bytes], text: LlmText) -> tuple[bytes, float]:
    audio = bytearray()
    first_s = 0.0
    for chunk in chunks:
        if not audio:
            first_s = time.perf_counter()
            text.first_audio.set()
        audio.extend(chunk)
    return bytes(audio), first_s


def test_legacy_websocket_session_streams_audio_before_stop(live_server: str) -> None:
    text = LlmText()
    ws = legacy.WebSocketSession("unused", base_url=live_server)
    try:
        audio, first_s = collect(ws.tts(legacy.TTSRequest(text="", format="pcm"), text), text)
    finally:
        ws.close()
    assert text.stop_s is not None and first_s < text.stop_s
    assert 3.0 < pcm_seconds(audio, PIPER_RATE_HZ) < 9.0


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus"])
def test_new_sdk_stream_websocket_in_every_format(client: FishAudio, fmt: str) -> None:
    text = LlmText()
    audio, first_s = collect(client.tts.stream_websocket(text, format=fmt), text)
    assert text.stop_s is not None and first_s < text.stop_s
    seconds = pcm_seconds(audio, PIPER_RATE_HZ) if fmt == "pcm" else decoded_seconds(audio)
    assert 3.0 < seconds < 9.0


def test_live_errors_raise_in_the_sdk(client: FishAudio) -> None:
    with pytest.raises(WebSocketError):
        list(client.tts.stream_websocket(iter(["Hello."]), reference_id="nobody"))
    with pytest.raises(WebSocketError):
        list(client.tts.stream_websocket(iter(["Hello."]), config=TTSConfig(temperature=0.9)))
