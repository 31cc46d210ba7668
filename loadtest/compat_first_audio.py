"""Time to first audio through the real clients of the compatibility interfaces.

    python -m loadtest.compat_first_audio --spawn [--runs 10]
    python -m loadtest.compat_first_audio --url http://127.0.0.1:8000 --wyoming-port 10200

Per client, ``--runs`` measurements after one warm-up, each printed, then the medians (JSON):

- ``wyoming_plain``: Home Assistant's ``synthesize`` (``loadtest.home_assistant``): from writing
  it to the first ``audio-chunk``;
- ``wyoming_streaming``: Home Assistant's streaming sequence with the text as an LLM's deltas:
  from writing the delta that completes the first sentence (the next one's first word) to the
  first ``audio-chunk``;
- ``fish_legacy_http``: ``fish_audio_sdk.Session.tts`` (it streams the body): from the call to
  the first chunk;
- ``fish_new_http``: ``fishaudio``'s ``tts.stream``, which reads the whole body before it yields
  anything: its first audio is the whole request;
- ``fish_legacy_live`` / ``fish_new_live``: ``WebSocketSession.tts`` / ``tts.stream_websocket``
  with the same deltas: from sending the completing delta to the first audio chunk.

The sentence is the native benchmark's (``loadtest.first_audio``); formats are raw PCM. Loopback
servers only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from urllib.parse import urlparse

import fish_audio_sdk
from fishaudio import FishAudio

from loadtest import home_assistant
from loadtest.first_audio import SENTENCE_12_WORDS
from loadtest.spawn import add_target_arguments, free_port, target_server

# An LLM's deltas of the sentence; the first sentence is complete with the next one's first word.
DELTAS = [w if i == 0 else " " + w for i, w in enumerate(SENTENCE_12_WORDS.split())]
COMPLETING = " Then"
REST = [" it", " runs", " home."]
DELTA_INTERVAL_S = 0.02  # a fast LLM's token cadence
API_KEY = "unused"


class Deltas:
    """The deltas, with the time the completing one was handed to the client."""

    def __init__(self) -> None:
        self.completed_s: float | None = None

    def words(self) -> Iterator[str]:
        for delta in DELTAS:
            time.sleep(DELTA_INTERVAL_S)
            yield delta
        self.completed_s = time.perf_counter()
        yield COMPLETING
        yield from REST

    async def async_words(self) -> AsyncIterator[str]:
        for delta in DELTAS:
            await asyncio.sleep(DELTA_INTERVAL_S)
            yield delta
        self.completed_s = time.perf_counter()
        yield COMPLETING
        for delta in REST:
            yield delta


def _ms(since_s: float | None, until_s: float | None) -> float:
    if since_s is None or until_s is None:
        raise RuntimeError("no audio came back")
    return 1000.0 * (until_s - since_s)


def wyoming_plain(host: str, port: int) -> float:
    result = asyncio.run(home_assistant.synthesize(host, port, SENTENCE_12_WORDS))
    return _ms(result.started_s, result.first_audio_s)


def wyoming_streaming(host: str, port: int) -> float:
    deltas = Deltas()
    result = asyncio.run(home_assistant.stream(host, port, deltas.async_words()))
    return _ms(deltas.completed_s, result.first_audio_s)


def fish_legacy_http(url: str) -> float:
    session = fish_audio_sdk.Session(API_KEY, base_url=url)
    started_s = time.perf_counter()
    first_s = None
    for chunk in session.tts(fish_audio_sdk.TTSRequest(text=SENTENCE_12_WORDS, format="pcm")):
        if chunk and first_s is None:
            first_s = time.perf_counter()
    return _ms(started_s, first_s)


def fish_new_http(url: str) -> float:
    with FishAudio(api_key=API_KEY, base_url=url) as client:
        started_s = time.perf_counter()
        first_s = None
        for _ in client.tts.stream(text=SENTENCE_12_WORDS, format="pcm"):
            first_s = first_s or time.perf_counter()
        return _ms(started_s, first_s)


def fish_legacy_live(url: str) -> float:
    deltas = Deltas()
    with fish_audio_sdk.WebSocketSession(API_KEY, base_url=url) as ws:
        first_s = None
        request = fish_audio_sdk.TTSRequest(text="", format="pcm")
        for _ in ws.tts(request, deltas.words()):
            first_s = first_s or time.perf_counter()
    return _ms(deltas.completed_s, first_s)


def fish_new_live(url: str) -> float:
    deltas = Deltas()
    with FishAudio(api_key=API_KEY, base_url=url) as client:
        first_s = None
        for _ in client.tts.stream_websocket(deltas.words(), format="pcm"):
            first_s = first_s or time.perf_counter()
    return _ms(deltas.completed_s, first_s)


def measure(url: str, wyoming_port: int, runs: int) -> dict[str, object]:
    host = urlparse(url).hostname or "127.0.0.1"
    clients: dict[str, Callable[[], float]] = {
        "wyoming_plain": lambda: wyoming_plain(host, wyoming_port),
        "wyoming_streaming": lambda: wyoming_streaming(host, wyoming_port),
        "fish_legacy_http": lambda: fish_legacy_http(url),
        "fish_new_http": lambda: fish_new_http(url),
        "fish_legacy_live": lambda: fish_legacy_live(url),
        "fish_new_live": lambda: fish_new_live(url),
    }
    result: dict[str, object] = {"sentence": SENTENCE_12_WORDS, "runs": runs}
    for name, run in clients.items():
        run()  # warm-up
        times = []
        for i in range(runs):
            times.append(run())
            print(f"  {name} {i + 1}/{runs}: {times[-1]:.1f} ms", file=sys.stderr)
        result[name] = {
            "first_audio_ms_p50": round(statistics.median(times), 1),
            "runs_ms": [round(t, 1) for t in times],
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_target_arguments(parser)
    parser.add_argument("--wyoming-port", type=int, help="the server's Wyoming port (--url)")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    if not args.spawn and args.wyoming_port is None:
        parser.error("--wyoming-port is needed with --url")
    port = args.wyoming_port or free_port()
    with target_server(args, parser, ("--wyoming-port", str(port))) as url:
        result = measure(url, port, args.runs)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
