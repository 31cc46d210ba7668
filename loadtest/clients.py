"""One realistic streaming client: text at LLM token cadence in, audio against a playback clock.

The client sends each utterance as small text deltas (like an LLM's tokens), then ``end``. It
plays the audio it receives on a virtual clock that starts at the first audio frame: whenever
the clock passes the end of the audio received so far, that is an underrun (the listener hears
a gap) and the clock waits for more audio.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass, field

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

SAMPLE_RATE_HZ = 24_000
BYTES_PER_SAMPLE = 2
RECEIVE_TIMEOUT_S = 120.0
_SENTENCE_END = re.compile(r"[.!?](\s|$)")
OVERLOADED_CLOSE = 1013


@dataclass
class PlaybackClock:
    """Virtual playback of received audio; counts underruns and the smallest lead."""

    started_s: float | None = None
    received_s: float = 0.0  # seconds of audio received
    paused_s: float = 0.0  # total time spent waiting after underruns
    underruns: int = 0
    min_lead_s: float = float("inf")

    def on_audio(self, now_s: float, seconds: float) -> None:
        if self.started_s is None:
            self.started_s = now_s
        else:
            lead = self.received_s - self._played(now_s)
            if lead < 0:  # the listener has been hearing silence since the buffer ran dry
                self.underruns += 1
                self.paused_s += -lead
                lead = 0.0
            self.min_lead_s = min(self.min_lead_s, lead)
        self.received_s += seconds

    def _played(self, now_s: float) -> float:
        assert self.started_s is not None
        return now_s - self.started_s - self.paused_s


@dataclass
class UtteranceResult:
    ttfa_ms: float | None = None
    server_ttfa_ms: float | None = None
    audio_s: float = 0.0
    underruns: int = 0
    min_lead_ms: float | None = None
    error: str | None = None
    refused: bool = False  # the server said overloaded (a refusal, not a failure)
    refusal_ms: float | None = None  # how long the refusal took


@dataclass
class ClientResult:
    utterances: list[UtteranceResult] = field(default_factory=list)


def token_deltas(text: str, rng: random.Random) -> list[str]:
    """Split ``text`` into LLM-token-sized pieces (1–6 characters)."""
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        pieces.append(text[i : i + n])
        i += n
    return pieces


async def speak_utterance(
    ws: ClientConnection,
    context: str,
    text: str,
    cadence_s: tuple[float, float],
    rng: random.Random,
) -> UtteranceResult:
    """``cadence_s``: the range of the pause between two tokens (drawn per token)."""
    result = UtteranceResult()
    clock = PlaybackClock()
    first_sentence_sent_s: float | None = None
    asked_s = time.perf_counter()
    await ws.send(orjson.dumps({"type": "start", "context": context}).decode())

    async def send_text() -> None:
        nonlocal first_sentence_sent_s
        sent = ""
        for piece in token_deltas(text, rng):
            await ws.send(
                orjson.dumps({"type": "text", "context": context, "text": piece}).decode()
            )
            sent += piece
            if first_sentence_sent_s is None and _SENTENCE_END.search(sent):
                first_sentence_sent_s = time.perf_counter()
            await asyncio.sleep(rng.uniform(*cadence_s))
        await ws.send(orjson.dumps({"type": "end", "context": context}).decode())
        if first_sentence_sent_s is None:
            first_sentence_sent_s = time.perf_counter()

    sender = asyncio.create_task(send_text())
    try:
        while True:
            frame = await asyncio.wait_for(ws.recv(), RECEIVE_TIMEOUT_S)
            now_s = time.perf_counter()
            if isinstance(frame, bytes):
                seconds = (len(frame) - 1 - frame[0]) / BYTES_PER_SAMPLE / SAMPLE_RATE_HZ
                if result.ttfa_ms is None:
                    reference_s = first_sentence_sent_s or now_s
                    result.ttfa_ms = 1000.0 * (now_s - reference_s)
                clock.on_audio(now_s, seconds)
                continue
            message = orjson.loads(frame)
            if message.get("type") == "error" and message.get("code") == "overloaded":
                result.refused = True
                result.refusal_ms = 1000.0 * (now_s - asked_s)
                break
            if message.get("type") == "error":
                result.error = message.get("code", "error")
            if message.get("type") == "done" and message.get("context") == context:
                result.server_ttfa_ms = message["stats"].get("ttfa_ms")
                break
    except ConnectionClosed as exc:
        if exc.rcvd is not None and exc.rcvd.code == OVERLOADED_CLOSE:
            result.refused = True
            result.refusal_ms = 1000.0 * (time.perf_counter() - asked_s)
        else:
            result.error = type(exc).__name__
    except (TimeoutError, OSError) as exc:
        result.error = type(exc).__name__
    finally:
        sender.cancel()
    result.audio_s = clock.received_s
    result.underruns = clock.underruns
    if clock.min_lead_s != float("inf"):
        result.min_lead_ms = 1000.0 * clock.min_lead_s
    return result


async def run_client(
    ws_url: str, client_id: int, texts: list[str], cadence_s: tuple[float, float], seed: int
) -> ClientResult:
    rng = random.Random(seed * 7919 + client_id)
    out = ClientResult()
    asked_s = time.perf_counter()
    try:
        async with connect(ws_url, max_size=None) as ws:
            for i, text in enumerate(texts):
                context = f"c{client_id}-{i}"
                result = await speak_utterance(ws, context, text, cadence_s, rng)
                out.utterances.append(result)
                if result.refused or result.error:
                    break
    except ConnectionClosed as exc:  # refused as the socket opened (1013)
        refused = exc.rcvd is not None and exc.rcvd.code == OVERLOADED_CLOSE
        waited_ms = 1000.0 * (time.perf_counter() - asked_s)
        out.utterances.append(
            UtteranceResult(refused=True, refusal_ms=waited_ms)
            if refused
            else UtteranceResult(error=type(exc).__name__)
        )
    except OSError as exc:
        out.utterances.append(UtteranceResult(error=type(exc).__name__))
    return out
