"""Synthesis without a server, for ``streamtts say``: the same engine and segmenter."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from streamtts.audio import encode_samples
from streamtts.config import Settings
from streamtts.engine.factory import create_engine
from streamtts.options import parse_options
from streamtts.segmenter import segment_text
from streamtts.voices.catalog import DEFAULT_VOICE_ALIAS, VoiceCatalog


async def synthesize_to_wav(
    settings: Settings, text: str, output: Path, voice: str | None = None, speed: float = 1.0
) -> float:
    """Speak ``text`` into a 16-bit mono WAV at the engine's rate; returns seconds of audio."""
    options = parse_options({"speed": speed})  # OptionError (a ValueError) when out of range
    engine = create_engine(settings, offline=True)
    await engine.start()
    try:
        voices = VoiceCatalog(engine, settings.voices)  # cloned voices of the library too
        await voices.refresh()
        stream = engine.open_stream(voices.resolve(voice or DEFAULT_VOICE_ALIAS), options)
        pieces: list[np.ndarray] = []
        for segment in segment_text(text, settings.segmenter):
            async for pcm in stream.synthesize(segment):
                pieces.append(pcm)
        stream.close()
    finally:
        await engine.stop()
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    output.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(output), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(stream.sample_rate)
        wav.writeframes(encode_samples(audio, "pcm_s16le"))
    return audio.size / stream.sample_rate
