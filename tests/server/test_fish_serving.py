"""The Fish engine served end to end (``synthetic:tiny``: real code path, noise output)."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest

from streamtts.audio import decode_samples
from tests.ws_client import StreamClient

FRAME_S = 2048 / 44100


@pytest.fixture
def ws_url(live_fish_server: str) -> str:
    return live_fish_server.replace("http://", "ws://")


async def test_a_context_streams_frames_of_audio_with_stats(ws_url: str) -> None:
    client = await StreamClient.open(ws_url)
    result = await client.speak("f", "One two three four. Five six.", "pcm_f32le", 44100)
    await client.close()
    samples = decode_samples(bytes(result.audio), "pcm_f32le")
    # synthetic:tiny speaks 9 frames per word: 6 words.
    assert samples.size == 6 * 9 * 2048
    assert float(np.abs(samples).max()) > 0  # noise, but not silence
    done = result.done
    assert done is not None and done["reason"] == "end"
    assert done["stats"]["ttfa_ms"] > 0
    assert done["stats"]["rtf"] > 0
    assert done["stats"]["audio_ms"] == pytest.approx(6 * 9 * FRAME_S * 1000, abs=0.1)
    assert [s["text"] for s in result.of_type("segment")] == ["One two three four.", "Five six."]


async def test_a_client_that_stops_reading_does_not_stall_others(ws_url: str) -> None:
    stalled = await StreamClient.open(ws_url)
    await stalled.send(type="start", context="s", format={"encoding": "pcm_f32le"})
    await stalled.send(type="text", context="s", text=" ".join(["word"] * 300) + ".")
    await stalled.send(type="end", context="s")
    # ...and never reads again. Meanwhile others are served promptly.
    await asyncio.sleep(0.5)
    started_s = time.perf_counter()
    results = await asyncio.gather(
        *(speak_once(ws_url, f"other-{i}", "Other streams are not held up.") for i in range(3))
    )
    assert results == [6 * 9 * 2048 * 2] * 3  # six words, s16 at the model rate
    assert time.perf_counter() - started_s < 30
    await stalled.ws.close()


async def speak_once(ws_url: str, context: str, text: str) -> int:
    client = await StreamClient.open(ws_url)
    result = await client.speak(context, text, "pcm_s16le", 44100)
    await client.close()
    return len(result.audio)


def test_openai_sdk_streams_from_the_fish_engine(live_fish_server: str) -> None:
    client = openai.OpenAI(base_url=live_fish_server + "/v1", api_key="x", max_retries=0)
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="Four words right here.", response_format="pcm"
    ) as response:
        pcm = b"".join(response.iter_bytes())
    seconds = len(pcm) / 2 / 24000
    assert seconds == pytest.approx(4 * 9 * FRAME_S, abs=0.01)


def test_voices_name_the_synthetic_model_honestly(live_fish_server: str) -> None:
    voices = httpx.get(live_fish_server + "/v1/voices").json()["voices"]
    assert voices[0]["engine"] == "fish"
    assert "noise" in voices[0]["description"]
