"""Reference uploads decoded by PyAV: every format users send, mono, bounded while decoding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamtts.voices import audio_input
from streamtts.voices.audio_input import (
    AudioTooLongError,
    AudioTooShortError,
    UnsupportedAudioError,
    decode_reference,
)
from tests.audio_files import encode, stereo_wav, tone


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac", "m4a"])
def test_every_upload_format_decodes_to_mono_of_the_right_length(fmt: str) -> None:
    rate = 48_000 if fmt == "opus" else 22_050
    decoded = decode_reference(encode(tone(3.0, rate), rate, fmt), 2.0, 30.0)
    assert decoded.samples.ndim == 1 and decoded.samples.dtype == np.float32
    assert decoded.duration_s == pytest.approx(3.0, abs=0.1)  # codec padding at most
    assert 0.1 < float(np.sqrt(np.mean(decoded.samples**2))) < 0.4


def test_channels_are_mixed_to_mono() -> None:
    samples = tone(2.5, 16_000, channels=2)
    samples[:, 1] = 0.0
    decoded = decode_reference(stereo_wav(samples, 16_000), 2.0, 30.0)
    np.testing.assert_allclose(decoded.samples, samples[:, 0] / 2, atol=1e-4)


def test_length_bounds() -> None:
    with pytest.raises(AudioTooShortError, match="at least 2 s"):
        decode_reference(encode(tone(1.0), 22_050, "wav"), 2.0, 30.0)
    with pytest.raises(AudioTooLongError, match="longer than 5 s"):
        decode_reference(encode(tone(6.0), 22_050, "flac"), 2.0, 5.0)


def test_a_file_that_decodes_to_hours_is_stopped_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten minutes of silence compress to a small FLAC; decoding stops once past the bound."""
    rate = 8_000
    data = encode(np.zeros(600 * rate, np.float32), rate, "flac")
    assert len(data) < 2_000_000
    converted: list[int] = []
    real = audio_input.av.AudioResampler

    class Counting:
        def __init__(self, **kwargs: Any) -> None:
            self._inner = real(**kwargs)

        def resample(self, frame: Any) -> Any:
            out = self._inner.resample(frame)
            converted.extend(f.samples for f in out)
            return out

    monkeypatch.setattr(audio_input.av, "AudioResampler", Counting)
    with pytest.raises(AudioTooLongError):
        decode_reference(data, 2.0, 30.0)
    assert 30 * rate < sum(converted) < 31 * rate  # read just past 30 s of the 600


@pytest.mark.parametrize(
    "data", [b"", b"not audio at all" * 10, b"RIFF\x00\x00\x00\x00WAVEjunk", bytes(range(256)) * 4]
)
def test_what_is_not_audio_is_refused(data: bytes) -> None:
    with pytest.raises(UnsupportedAudioError):
        decode_reference(data, 2.0, 30.0)
