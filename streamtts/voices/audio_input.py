"""Reference recordings in: any file PyAV can decode (wav, flac, mp3, ogg/opus, m4a, webm…),
mixed to mono float32 at its own rate, bounded while decoding (a small file that decodes to hours
is stopped early). Torch-free; run it on a thread."""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np
import numpy.typing as npt

MIN_RATE_HZ = 8_000
MAX_RATE_HZ = 192_000


class AudioInputError(ValueError):
    code = "unsupported_audio"


class UnsupportedAudioError(AudioInputError):
    code = "unsupported_audio"


class AudioTooShortError(AudioInputError):
    code = "audio_too_short"


class AudioTooLongError(AudioInputError):
    code = "audio_too_long"


@dataclass(frozen=True)
class DecodedAudio:
    samples: npt.NDArray[np.float32]  # [L] mono
    rate_hz: int
    format: str  # the container PyAV found ("wav", "mp3", "ogg", ...)

    @property
    def duration_s(self) -> float:
        return self.samples.size / self.rate_hz


def decode_reference(data: bytes, min_s: float, max_s: float) -> DecodedAudio:
    """Decode the first audio stream of ``data``; raises an :class:`AudioInputError`."""
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise UnsupportedAudioError(f"not an audio file PyAV can read: {exc}") from None
    with container:
        if not container.streams.audio:
            raise UnsupportedAudioError("the file holds no audio stream")
        stream = container.streams.audio[0]
        to_float = av.AudioResampler(format="fltp")  # planar float32, same layout and rate
        pieces: list[npt.NDArray[np.float32]] = []
        rate_hz = 0
        total = 0
        try:
            for frame in container.decode(stream):
                for converted in to_float.resample(frame):
                    rate_hz = converted.sample_rate
                    if not MIN_RATE_HZ <= rate_hz <= MAX_RATE_HZ:
                        raise UnsupportedAudioError(f"sample rate {rate_hz} Hz is not supported")
                    planes = converted.to_ndarray()  # [channels, n]
                    pieces.append(planes.mean(axis=0, dtype=np.float32))
                    total += planes.shape[1]
                    if total > max_s * rate_hz:
                        raise AudioTooLongError(
                            f"the reference is longer than {max_s:g} s; give {min_s:g} to "
                            f"{max_s:g} s of clear speech"
                        )
        except AudioInputError:
            raise
        except (av.FFmpegError, ValueError) as exc:
            raise UnsupportedAudioError(f"the audio could not be decoded: {exc}") from None
    if total == 0:
        raise UnsupportedAudioError("the file holds no audio samples")
    samples = np.concatenate(pieces).astype(np.float32, copy=False)
    if not np.isfinite(samples).all():
        raise UnsupportedAudioError("the audio holds non-finite samples")
    decoded = DecodedAudio(samples, rate_hz, container.format.name.split(",")[0])
    if decoded.duration_s < min_s:
        raise AudioTooShortError(
            f"the reference is {decoded.duration_s:.2f} s long; give at least {min_s:g} s"
        )
    return decoded
