"""Audio files made in the test, in the formats users upload (no files checked in)."""

from __future__ import annotations

import io

import av
import numpy as np
import numpy.typing as npt

from streamtts.audio import make_container_encoder


def tone(seconds: float, rate_hz: int = 22_050, channels: int = 1) -> npt.NDArray[np.float32]:
    """A chirp (so no two frames are alike): [L] or [L, channels] float32."""
    t = np.arange(int(seconds * rate_hz), dtype=np.float32) / rate_hz
    mono = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)
    return mono if channels == 1 else np.stack([mono] * channels, axis=1)


def encode(samples: npt.NDArray[np.float32], rate_hz: int, fmt: str) -> bytes:
    """``fmt``: wav, flac, mp3, opus (Ogg), aac (ADTS) — the server's own encoders — or m4a."""
    if fmt == "m4a":
        return _m4a(samples, rate_hz)
    encoder = make_container_encoder(fmt, rate_hz)
    return encoder.write(samples) + encoder.finish()


def _m4a(samples: npt.NDArray[np.float32], rate_hz: int) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="ipod") as container:
        stream = container.add_stream("aac", rate=rate_hz, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None].astype(np.float32), "fltp", "mono")
        frame.sample_rate = rate_hz
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def stereo_wav(samples: npt.NDArray[np.float32], rate_hz: int) -> bytes:
    """A 16-bit stereo WAV of ``samples`` [L, 2]."""
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(rate_hz)
        wav.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


async def bundled_voice_speech(text: str) -> tuple[npt.NDArray[np.float32], int]:
    """``text`` spoken by the bundled Piper voice (real speech, made in the test)."""
    from streamtts.options import SynthesisOptions
    from streamtts.piper.engine import PiperEngine
    from streamtts.piper.settings import PiperSettings
    from streamtts.piper.spec import PiperSpec
    from streamtts.segmenter import segment_text

    engine = PiperEngine(PiperSpec(), PiperSettings(engine_threads=1))
    await engine.start()
    try:
        stream = engine.open_stream(engine.default_voice, SynthesisOptions())
        pieces = [pcm for s in segment_text(text) async for pcm in stream.synthesize(s)]
        stream.close()
        return np.concatenate(pieces), stream.sample_rate
    finally:
        await engine.stop()
