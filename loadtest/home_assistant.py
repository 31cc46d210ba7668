"""Home Assistant's Wyoming TTS client, reproduced with the ``wyoming`` package's
``AsyncTcpClient`` (from ``homeassistant/components/wyoming``: ``data.py`` ``load_wyoming_info``
and ``tts.py`` ``async_get_tts_audio`` / ``async_stream_tts_audio``), with timings.

- :func:`describe`: ``describe`` → ``info``, 1 s per try, 3 tries, a new connection each;
- :func:`synthesize`: one connection, ``synthesize``, audio until the first ``audio-stop``, the
  format taken from the first ``audio-chunk``;
- :func:`stream`: one connection; a writer task sends ``synthesize-start``, a
  ``synthesize-chunk`` per text delta, the whole text as ``synthesize`` (for servers without
  streaming) and ``synthesize-stop``, while the reader takes the format from the first
  ``audio-start``, collects every ``audio-chunk`` and stops at ``synthesize-stopped``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

INFO_TIMEOUT_S = 1.0
INFO_TRIES = 3
READ_TIMEOUT_S = 120.0


@dataclass
class TtsResult:
    started_s: float  # when the request's first event was written (perf_counter)
    rate: int | None = None
    width: int | None = None
    channels: int | None = None
    pcm: bytearray = field(default_factory=bytearray)
    chunks: int = 0
    formats: set[tuple[int, int, int]] = field(default_factory=set)  # of every audio-chunk
    first_audio_s: float | None = None
    stop_sent_s: float | None = None  # streaming: when synthesize-stop was written
    ended_s: float | None = None
    ended_by: str = "disconnect"  # audio-stop | synthesize-stopped | disconnect
    errors: list[Error] = field(default_factory=list)

    @property
    def first_audio_ms(self) -> float | None:
        if self.first_audio_s is None:
            return None
        return 1000.0 * (self.first_audio_s - self.started_s)

    @property
    def duration_s(self) -> float:
        if not self.rate or not self.width or not self.channels:
            return 0.0
        return len(self.pcm) / (self.rate * self.width * self.channels)

    def add_chunk(self, chunk: AudioChunk) -> None:
        if self.first_audio_s is None:
            self.first_audio_s = time.perf_counter()
        self.formats.add((chunk.rate, chunk.width, chunk.channels))
        self.pcm.extend(chunk.audio)
        self.chunks += 1


async def describe(host: str, port: int) -> Info | None:
    for _ in range(INFO_TRIES):
        try:
            async with AsyncTcpClient(host, port) as client, asyncio.timeout(INFO_TIMEOUT_S):
                await client.write_event(Describe().event())
                while True:
                    event = await client.read_event()
                    if event is None:
                        break
                    if Info.is_type(event.type):
                        return Info.from_event(event)
        except (TimeoutError, OSError):
            continue
    return None


async def synthesize(host: str, port: int, text: str, voice: str | None = None) -> TtsResult:
    async with AsyncTcpClient(host, port) as client:
        result = TtsResult(time.perf_counter())
        wanted = SynthesizeVoice(name=voice) if voice is not None else None
        await client.write_event(Synthesize(text=text, voice=wanted).event())
        while True:
            event = await asyncio.wait_for(client.read_event(), READ_TIMEOUT_S)
            if event is None:
                break
            if AudioStop.is_type(event.type):
                result.ended_by = "audio-stop"
                break
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                if result.rate is None:  # Home Assistant's WAV takes the first chunk's format
                    result.rate, result.width, result.channels = (
                        chunk.rate,
                        chunk.width,
                        chunk.channels,
                    )
                result.add_chunk(chunk)
            elif Error.is_type(event.type):
                result.errors.append(Error.from_event(event))  # Home Assistant ignores these
        result.ended_s = time.perf_counter()
        return result


async def stream(
    host: str,
    port: int,
    text: AsyncIterator[str],
    voice: str | None = None,
    result: TtsResult | None = None,
) -> TtsResult:
    """``result``, if given, is filled in as the audio arrives (a text source may watch it)."""
    client = AsyncTcpClient(host, port)
    await client.connect()
    result = result or TtsResult(0.0)
    result.started_s = time.perf_counter()
    wanted = SynthesizeVoice(name=voice) if voice is not None else None

    async def write() -> None:
        await client.write_event(SynthesizeStart(voice=wanted).event())
        message = ""
        async for delta in text:
            message += delta
            await client.write_event(SynthesizeChunk(text=delta).event())
        await client.write_event(Synthesize(text=message, voice=wanted).event())
        await client.write_event(SynthesizeStop().event())
        result.stop_sent_s = time.perf_counter()

    writer = asyncio.create_task(write())
    try:
        header_seen = False
        while True:
            event = await asyncio.wait_for(client.read_event(), READ_TIMEOUT_S)
            if event is None:
                break
            if header_seen and AudioChunk.is_type(event.type):
                result.add_chunk(AudioChunk.from_event(event))
            elif not header_seen and AudioStart.is_type(event.type):
                start = AudioStart.from_event(event)
                result.rate, result.width, result.channels = start.rate, start.width, start.channels
                header_seen = True
            elif SynthesizeStopped.is_type(event.type):
                result.ended_by = "synthesize-stopped"
                break
            elif Error.is_type(event.type):
                result.errors.append(Error.from_event(event))
        result.ended_s = time.perf_counter()
        await writer
        return result
    finally:
        writer.cancel()
        await client.disconnect()
