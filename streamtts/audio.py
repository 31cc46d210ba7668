"""Resampling and audio encoders: pure, I/O-free, no torch.

Everything here works on mono float32 PCM in [-1, 1] ("samples") and returns bytes or
float32 arrays. Three layers:

- :class:`StreamingResampler` — soxr's streaming resampler (engine rate → client rate), with an
  exact length guarantee over a whole stream.
- :func:`encode_samples` / :func:`decode_samples` — the raw sample encodings of the native
  WebSocket protocol: ``pcm_s16le``, ``pcm_f32le``, ``mulaw`` and ``alaw`` (ITU-T G.711).
- :class:`ContainerEncoder` (from :func:`make_container_encoder`) — the streamed HTTP response
  formats of OpenAI ``/v1/audio/speech``: ``pcm``, ``wav``, ``mp3``, ``opus`` (Ogg), ``flac``
  and ``aac`` (ADTS). Each ``write`` returns the bytes that are ready now, so a response can be
  streamed while audio is still being generated.
- :func:`make_stream_encoder` — one WebSocket context's audio: a raw encoding (stateless) or a
  streamed mp3 (the ElevenLabs protocol's default), behind the same ``write``/``finish``.

Conversions shared by every encoder (the one place they are defined):

- Samples are clipped to [-1, 1]; NaN becomes 0 (a broken vocoder output must not crash an
  encoder or produce garbage integers).
- Float → 16-bit: ``round(x * 32767)``. The scale is symmetric, so 1.0 → 32767 and
  -1.0 → -32767 (the code -32768 is never produced) and silence stays exactly 0. 16-bit → float
  is ``v / 32767``, so the round trip of a 16-bit value is exact.
"""

from __future__ import annotations

import abc
import contextlib
import fractions
from typing import Any, Final

import av
import av.audio.stream
import numpy as np
import numpy.typing as npt
import soxr

FloatArray = npt.NDArray[np.float32]

# --------------------------------------------------------------------------------------------
# Constants (units in the names)
# --------------------------------------------------------------------------------------------

SUPPORTED_ENCODINGS: Final = ("pcm_s16le", "pcm_f32le", "mulaw", "alaw")
"""Raw sample encodings of the native WebSocket protocol (mono, no header)."""

MIN_SAMPLE_RATE_HZ: Final = 8000
MAX_SAMPLE_RATE_HZ: Final = 48000

BYTES_PER_SAMPLE: Final[dict[str, int]] = {
    "pcm_s16le": 2,
    "pcm_f32le": 4,
    "mulaw": 1,
    "alaw": 1,
}

S16_FULL_SCALE: Final = 32767
"""Float 1.0 ↔ this 16-bit value (symmetric scaling; -32768 is never produced)."""

RESAMPLER_QUALITY: Final = "HQ"
"""soxr quality recipe, chosen by measurement (mono float32, 20 ms chunks, one CPU core): both
"HQ" and "VHQ" cost only 3-10 µs per 20 ms chunk, but for large down-sampling ratios "VHQ"
holds about twice as much audio back before its first output (44.1 kHz → 8 kHz: 170 ms vs
80 ms; → 16 kHz: 90 ms vs 50 ms), and first-audio latency is the product's headline. "HQ" is
20-bit precise, more than the 16-bit output needs."""

CONTAINER_FORMATS: Final = ("pcm", "wav", "mp3", "opus", "flac", "aac")
"""Response formats of OpenAI ``/v1/audio/speech`` (``aac`` is ADTS-framed AAC)."""

OPUS_SAMPLE_RATE_HZ: Final = 48000
"""Ogg Opus output is always encoded at 48 kHz, the Opus reference rate: Ogg Opus decoders
(browsers, ffmpeg, libopusfile) decode at 48 kHz whatever rate the header advertises, so input at
any other rate is resampled to 48 kHz inside the encoder (with :class:`StreamingResampler`)."""

MP3_BIT_RATE_BPS: Final = 64_000
"""Mono speech; 64 kb/s is transparent enough for TTS at 24 kHz."""
OPUS_BIT_RATE_BPS: Final = 48_000
AAC_BIT_RATE_BPS: Final = 64_000
OGG_PAGE_DURATION_US: Final = 100_000
"""Ogg pages are closed every 100 ms of audio instead of ffmpeg's 1 s default, so Opus bytes
leave the encoder with ≤ 100 ms of muxing delay (page overhead ≈ 2.5 kb/s)."""

WAV_HEADER_BYTES: Final = 44
WAV_UNKNOWN_SIZE: Final = 0xFFFFFFFF
"""RIFF and data chunk sizes written into a streamed WAV header: the length is not known when
the header is sent, so both use the maximum value, the de-facto "streaming / unknown length"
sentinel that ffmpeg, libsndfile, browsers and Python's ``wave`` accept (they read to EOF)."""

_CONTENT_TYPES: Final[dict[str, str]] = {
    # OpenAI documents ``pcm`` as headerless 24 kHz s16le and serves it as a binary body; the
    # spec (streaming-protocols.md §4.1) gives application/octet-stream. LiveKit picks its
    # parser from the Content-Type and treats anything but text/event-stream as raw audio.
    "pcm": "application/octet-stream",
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "flac": "audio/flac",
    "aac": "audio/aac",
}


def content_type(fmt: str) -> str:
    """HTTP ``Content-Type`` of a container format (one of :data:`CONTAINER_FORMATS`)."""
    try:
        return _CONTENT_TYPES[fmt]
    except KeyError:
        raise ValueError(f"unsupported audio format {fmt!r}") from None


# --------------------------------------------------------------------------------------------
# Shared conversions
# --------------------------------------------------------------------------------------------


def _as_mono_f32(samples: npt.ArrayLike) -> FloatArray:
    """A 1-D contiguous float32 view/copy of ``samples`` (no copy when it already is one)."""
    arr = np.ascontiguousarray(samples, dtype=np.float32)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    return arr


def _clipped(samples: FloatArray) -> FloatArray:
    """Clip to [-1, 1], NaN → 0 (a new array)."""
    out = np.clip(samples, -1.0, 1.0)
    np.nan_to_num(out, copy=False, nan=0.0)
    return out


def _to_s16(samples: FloatArray) -> npt.NDArray[np.int16]:
    """Float samples → int16 with the module's symmetric scaling (round half to even)."""
    return np.rint(_clipped(samples) * S16_FULL_SCALE).astype(np.int16)


# --------------------------------------------------------------------------------------------
# Resampling
# --------------------------------------------------------------------------------------------


class StreamingResampler:
    """Streaming mono float32 resampler from ``in_rate_hz`` to ``out_rate_hz``.

    Feed chunks of any size to :meth:`process`; call :meth:`flush` once at the end of the
    stream to get the tail that the filter holds back. Over a whole stream the total output
    length is ``round(n_in * out_rate_hz / in_rate_hz)`` (±1 sample). When the two rates are
    equal it is the identity (a copy of the input) and holds nothing back.

    After :meth:`flush` the resampler is finished: :meth:`flush` returns an empty array again
    and :meth:`process` raises ``RuntimeError``; make a new one for the next stream.
    """

    def __init__(self, in_rate_hz: int, out_rate_hz: int) -> None:
        for name, rate in (("in_rate_hz", in_rate_hz), ("out_rate_hz", out_rate_hz)):
            if not isinstance(rate, int | np.integer) or rate <= 0:
                raise ValueError(f"{name} must be a positive integer, got {rate!r}")
        self.in_rate_hz = int(in_rate_hz)
        self.out_rate_hz = int(out_rate_hz)
        self._stream: soxr.ResampleStream | None = None
        if self.in_rate_hz != self.out_rate_hz:
            self._stream = soxr.ResampleStream(
                self.in_rate_hz, self.out_rate_hz, 1, dtype="float32", quality=RESAMPLER_QUALITY
            )
        self._finished = False

    @property
    def is_identity(self) -> bool:
        return self._stream is None

    def process(self, samples: npt.ArrayLike) -> FloatArray:
        """Resample one chunk; returns the output samples ready now (possibly none)."""
        if self._finished:
            raise RuntimeError("StreamingResampler.process() after flush()")
        arr = _as_mono_f32(samples)
        if self._stream is None:
            return arr.copy()
        if arr.size == 0:
            return np.zeros(0, dtype=np.float32)
        out: FloatArray = self._stream.resample_chunk(arr)
        return out

    def flush(self) -> FloatArray:
        """End of stream: returns the remaining output samples. Idempotent."""
        if self._finished or self._stream is None:
            self._finished = True
            return np.zeros(0, dtype=np.float32)
        self._finished = True
        out: FloatArray = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return out


# --------------------------------------------------------------------------------------------
# Raw encodings (native protocol), ITU-T G.711 μ-law / A-law
# --------------------------------------------------------------------------------------------
#
# G.711 is defined on 14-bit (μ-law) and 13-bit (A-law) linear PCM. As in the ITU-T G.191
# reference implementation (g711.c), the 16-bit sample is arithmetically shifted right by 2
# (μ-law) or 3 (A-law) bits, then mapped to sign / 3-bit segment / 4-bit quantisation step. The
# encoders below are vectorised transcriptions of that algorithm; the decoders return the
# segment-midpoint reconstruction values of G.711 Tables 1a/2a in 16-bit units.

_ULAW_BIAS: Final = 0x21  # 33, in 14-bit units (0x84 = 132 in 16-bit units)
_ULAW_CLIP: Final = 8159  # largest 14-bit magnitude before biasing
# Largest biased 14-bit magnitude of each segment 0..7.
_ULAW_SEG_END: Final = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], np.int32)
# Largest 13-bit magnitude of each A-law segment 0..7.
_ALAW_SEG_END: Final = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], np.int32)
_ALAW_XOR_MASK: Final = 0x55  # even-bit inversion of A-law


def _s16_to_ulaw(pcm16: npt.NDArray[np.int16]) -> npt.NDArray[np.uint8]:
    v = pcm16.astype(np.int32) >> 2  # 14-bit, floor shift like g711.c
    negative = v < 0
    mag = np.minimum(np.where(negative, -v, v), _ULAW_CLIP) + _ULAW_BIAS
    seg = np.searchsorted(_ULAW_SEG_END, mag, side="left").astype(np.int32)  # 0..8
    code = (np.minimum(seg, 7) << 4) | ((mag >> (seg + 1)) & 0x0F)
    code = np.where(seg >= 8, 0x7F, code)  # clip to the largest magnitude
    mask = np.where(negative, 0x7F, 0xFF)  # complement; sign bit 1 = positive
    return (code ^ mask).astype(np.uint8)


def _ulaw_to_s16(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.int16]:
    u = (~codes.astype(np.int32)) & 0xFF
    seg = (u & 0x70) >> 4
    t = (((u & 0x0F) << 3) + 0x84) << seg
    return np.where((u & 0x80) != 0, 0x84 - t, t - 0x84).astype(np.int16)


def _s16_to_alaw(pcm16: npt.NDArray[np.int16]) -> npt.NDArray[np.uint8]:
    v = pcm16.astype(np.int32) >> 3  # 13-bit, floor shift like g711.c
    negative = v < 0
    mag = np.where(negative, -v - 1, v)  # one's complement magnitude for negatives
    seg = np.searchsorted(_ALAW_SEG_END, mag, side="left").astype(np.int32)  # 0..8
    shift = np.where(seg < 2, 1, seg)
    code = (np.minimum(seg, 7) << 4) | ((mag >> shift) & 0x0F)
    code = np.where(seg >= 8, 0x7F, code)  # clip to the largest magnitude
    mask = np.where(negative, _ALAW_XOR_MASK, _ALAW_XOR_MASK | 0x80)  # sign bit 1 = positive
    return (code ^ mask).astype(np.uint8)


def _alaw_to_s16(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.int16]:
    a = codes.astype(np.int32) ^ _ALAW_XOR_MASK
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where((a & 0x80) != 0, t, -t).astype(np.int16)


def encode_samples(samples_f32: npt.ArrayLike, encoding: str) -> bytes:
    """Encode mono float samples as headerless ``encoding`` bytes.

    - ``pcm_s16le``: ``round(clip(x) * 32767)``, little-endian int16 (2 bytes/sample).
    - ``pcm_f32le``: ``clip(x)`` as little-endian float32 (4 bytes/sample).
    - ``mulaw`` / ``alaw``: ITU-T G.711 of the same 16-bit value (1 byte/sample), byte-identical
      to the G.191 reference encoder.
    """
    arr = _as_mono_f32(samples_f32)
    if encoding == "pcm_s16le":
        return _to_s16(arr).astype("<i2", copy=False).tobytes()
    if encoding == "pcm_f32le":
        return _clipped(arr).astype("<f4", copy=False).tobytes()
    if encoding == "mulaw":
        return _s16_to_ulaw(_to_s16(arr)).tobytes()
    if encoding == "alaw":
        return _s16_to_alaw(_to_s16(arr)).tobytes()
    raise ValueError(f"unsupported encoding {encoding!r}; expected one of {SUPPORTED_ENCODINGS}")


def decode_samples(data: bytes, encoding: str) -> FloatArray:
    """Inverse of :func:`encode_samples` (float32 in [-1, 1]; lossy for μ-law/A-law)."""
    if encoding not in BYTES_PER_SAMPLE:
        raise ValueError(
            f"unsupported encoding {encoding!r}; expected one of {SUPPORTED_ENCODINGS}"
        )
    if len(data) % BYTES_PER_SAMPLE[encoding]:
        raise ValueError(f"{len(data)} bytes is not a whole number of {encoding} samples")
    if encoding == "pcm_f32le":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if encoding == "pcm_s16le":
        pcm16 = np.frombuffer(data, dtype="<i2").astype(np.int16)
    elif encoding == "mulaw":
        pcm16 = _ulaw_to_s16(np.frombuffer(data, dtype=np.uint8))
    else:
        pcm16 = _alaw_to_s16(np.frombuffer(data, dtype=np.uint8))
    return (pcm16.astype(np.float32) / np.float32(S16_FULL_SCALE)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Container encoders (HTTP response bodies)
# --------------------------------------------------------------------------------------------


class ContainerEncoder(abc.ABC):
    """Streams mono float samples into one audio file format.

    ``write`` returns the encoded bytes that are ready now (possibly ``b""``: codecs hold back
    up to a frame or an Ogg page); ``finish`` flushes the codec and returns the rest. The
    concatenation of all returned bytes is a complete, playable file. ``write`` after
    ``finish`` raises ``RuntimeError``; a second ``finish`` returns ``b""``.
    """

    format: str
    sample_rate_hz: int
    """Rate of the samples given to :meth:`write`."""
    output_sample_rate_hz: int
    """Rate of the encoded stream (differs only where the codec needs it, e.g. Opus)."""

    @property
    def content_type(self) -> str:
        return content_type(self.format)

    @abc.abstractmethod
    def write(self, samples_f32: npt.ArrayLike) -> bytes: ...

    @abc.abstractmethod
    def finish(self) -> bytes: ...

    def close(self) -> None:
        """Release the encoder without finishing the file (client gone). Idempotent; after
        it ``write`` raises and ``finish`` returns ``b""``."""
        self._finished = True

    _finished: bool


class _PcmEncoder(ContainerEncoder):
    """``pcm``: headerless s16le."""

    def __init__(self, sample_rate_hz: int) -> None:
        self.format = "pcm"
        self.sample_rate_hz = self.output_sample_rate_hz = sample_rate_hz
        self._finished = False

    def write(self, samples_f32: npt.ArrayLike) -> bytes:
        if self._finished:
            raise RuntimeError("write() after finish()")
        return encode_samples(samples_f32, "pcm_s16le")

    def finish(self) -> bytes:
        self._finished = True
        return b""


def wav_header(sample_rate_hz: int, data_bytes: int = WAV_UNKNOWN_SIZE) -> bytes:
    """The 44-byte header of a mono 16-bit PCM WAV file.

    ``data_bytes`` defaults to the unknown-length sentinel (0xFFFFFFFF), in which case the RIFF
    size is the sentinel too; otherwise RIFF size = 36 + data_bytes.
    """
    riff_bytes = WAV_UNKNOWN_SIZE if data_bytes == WAV_UNKNOWN_SIZE else 36 + data_bytes
    block_align_bytes = 2  # 1 channel x 16 bit
    return b"".join(
        (
            b"RIFF",
            riff_bytes.to_bytes(4, "little"),
            b"WAVE",
            b"fmt ",
            (16).to_bytes(4, "little"),  # fmt chunk size
            (1).to_bytes(2, "little"),  # WAVE_FORMAT_PCM
            (1).to_bytes(2, "little"),  # channels
            sample_rate_hz.to_bytes(4, "little"),
            (sample_rate_hz * block_align_bytes).to_bytes(4, "little"),  # byte rate
            block_align_bytes.to_bytes(2, "little"),
            (16).to_bytes(2, "little"),  # bits per sample
            b"data",
            data_bytes.to_bytes(4, "little"),
        )
    )


class _WavEncoder(_PcmEncoder):
    """``wav``: a 44-byte header with unknown-length sentinels, then s16le."""

    def __init__(self, sample_rate_hz: int) -> None:
        super().__init__(sample_rate_hz)
        self.format = "wav"
        self._header_sent = False

    def _header_once(self) -> bytes:
        if self._header_sent:
            return b""
        self._header_sent = True
        return wav_header(self.sample_rate_hz)

    def write(self, samples_f32: npt.ArrayLike) -> bytes:
        if self._finished:
            raise RuntimeError("write() after finish()")
        return self._header_once() + encode_samples(samples_f32, "pcm_s16le")

    def finish(self) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        return self._header_once()  # an empty stream is still a valid (empty) WAV file


class _ByteSink:
    """A write-only, non-seekable file object for PyAV; drained by the encoder."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def drain(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class _AvEncoder(ContainerEncoder):
    """mp3 / Ogg Opus / FLAC / ADTS AAC through PyAV (libavformat + libavcodec).

    The muxer writes into a :class:`_ByteSink` without ``seek``, so it runs in streaming mode:
    nothing is rewritten at the end (FLAC's STREAMINFO keeps "total samples unknown", MP3 has no
    Xing/LAME length tag), which every decoder accepts. PyAV's I/O layer flushes after each
    packet, so the bytes of every encoded packet are returned by the ``write`` that produced it.
    """

    # fmt → (container, codec, sample format fed to the codec, bit rate in b/s or None)
    _SPECS: Final[dict[str, tuple[str, str, str, int | None]]] = {
        "mp3": ("mp3", "libmp3lame", "fltp", MP3_BIT_RATE_BPS),
        "opus": ("ogg", "libopus", "flt", OPUS_BIT_RATE_BPS),
        "flac": ("flac", "flac", "s16", None),
        "aac": ("adts", "aac", "fltp", AAC_BIT_RATE_BPS),
    }

    def __init__(self, fmt: str, sample_rate_hz: int, bit_rate_bps: int | None = None) -> None:
        container_name, codec_name, self._sample_format, default_bit_rate_bps = self._SPECS[fmt]
        if bit_rate_bps is not None and default_bit_rate_bps is None:
            raise ValueError(f"{fmt} has no bit rate to set")
        bit_rate_bps = bit_rate_bps or default_bit_rate_bps
        self.format = fmt
        self.sample_rate_hz = sample_rate_hz
        self.output_sample_rate_hz = _codec_rate_hz(fmt, codec_name, sample_rate_hz)
        self._resampler = (
            StreamingResampler(sample_rate_hz, self.output_sample_rate_hz)
            if self.output_sample_rate_hz != sample_rate_hz
            else None
        )
        self._sink = _ByteSink()
        options: dict[str, str] = {}
        if container_name == "ogg":
            options["page_duration"] = str(OGG_PAGE_DURATION_US)
        self._container = av.open(self._sink, mode="w", format=container_name, options=options)
        stream = self._container.add_stream(codec_name, rate=self.output_sample_rate_hz)
        if not isinstance(stream, av.audio.stream.AudioStream):  # pragma: no cover
            raise TypeError(f"{codec_name} is not an audio codec")
        stream.layout = "mono"
        stream.format = self._sample_format
        if bit_rate_bps is not None:
            stream.bit_rate = bit_rate_bps
        self._stream = stream
        self._time_base = fractions.Fraction(1, self.output_sample_rate_hz)
        self._pts_samples = 0
        self._finished = False

    def _frame(self, samples: FloatArray) -> av.AudioFrame:
        planar: npt.NDArray[Any]
        if self._sample_format == "s16":
            planar = _to_s16(samples)[None, :]
            frame_format = "s16"
        else:
            planar = _clipped(samples)[None, :]
            frame_format = "flt"
        frame = av.AudioFrame.from_ndarray(planar, format=frame_format, layout="mono")
        frame.sample_rate = self.output_sample_rate_hz
        frame.time_base = self._time_base
        frame.pts = self._pts_samples
        self._pts_samples += samples.size
        return frame

    def _encode(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def write(self, samples_f32: npt.ArrayLike) -> bytes:
        if self._finished:
            raise RuntimeError("write() after finish()")
        samples = _as_mono_f32(samples_f32)
        if self._resampler is not None:
            samples = self._resampler.process(samples)
        if samples.size:
            self._encode(self._frame(samples))
        return self._sink.drain()

    def finish(self) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        if self._resampler is not None:
            tail = self._resampler.flush()
            if tail.size:
                self._encode(self._frame(tail))
        self._encode(None)  # drain the codec
        self._container.close()  # trailer (and the header, for an empty stream)
        return self._sink.drain()

    def close(self) -> None:
        if self._finished:
            return
        self._finished = True
        with contextlib.suppress(av.FFmpegError):
            self._container.close()
        self._sink.drain()


def _codec_rate_hz(fmt: str, codec_name: str, sample_rate_hz: int) -> int:
    """The rate the codec runs at: the input rate where the codec supports it, else the
    smallest supported rate above it (or the largest one). Opus: always 48 kHz."""
    if fmt == "opus":
        return OPUS_SAMPLE_RATE_HZ
    rates = av.codec.Codec(codec_name, "w").audio_rates
    if not rates or sample_rate_hz in rates:
        return sample_rate_hz
    higher = [r for r in rates if r > sample_rate_hz]
    return min(higher) if higher else max(rates)


def make_container_encoder(
    fmt: str, sample_rate_hz: int, bit_rate_bps: int | None = None
) -> ContainerEncoder:
    """A streaming encoder for ``fmt`` (one of :data:`CONTAINER_FORMATS`) fed mono float
    samples at ``sample_rate_hz``; ``bit_rate_bps`` overrides the lossy codecs' bit rate.

    - ``pcm``: headerless s16le at ``sample_rate_hz`` (OpenAI: 24 kHz).
    - ``wav``: 44-byte header with unknown-length sentinels, then s16le.
    - ``mp3`` (libmp3lame, 64 kb/s), ``flac`` (16-bit), ``aac`` (ADTS, 64 kb/s): at
      ``sample_rate_hz`` when the codec supports it, else resampled to the next supported rate.
    - ``opus``: Ogg Opus, 48 kb/s, always encoded at 48 kHz (input is resampled).

    ``bit_rate_bps`` replaces the default bit rate of mp3, opus and aac (the others have none:
    a bit rate for them is a ``ValueError``). ``output_sample_rate_hz`` on the result says which
    rate the file has.
    """
    if not isinstance(sample_rate_hz, int | np.integer) or sample_rate_hz <= 0:
        raise ValueError(f"sample_rate_hz must be a positive integer, got {sample_rate_hz!r}")
    rate = int(sample_rate_hz)
    if fmt in ("pcm", "wav") and bit_rate_bps is not None:
        raise ValueError(f"{fmt} has no bit rate to set")
    if fmt == "pcm":
        return _PcmEncoder(rate)
    if fmt == "wav":
        return _WavEncoder(rate)
    if fmt in _AvEncoder._SPECS:
        return _AvEncoder(fmt, rate, bit_rate_bps)
    raise ValueError(f"unsupported audio format {fmt!r}; expected one of {CONTAINER_FORMATS}")


# --------------------------------------------------------------------------------------------
# One WebSocket context's encoder
# --------------------------------------------------------------------------------------------

STREAM_CONTAINERS: Final = ("mp3",)
"""Encodings of a WebSocket context that are a compressed stream rather than raw samples."""


class StreamEncoder(abc.ABC):
    """One context's audio, chunk by chunk: ``write`` returns the bytes ready now (possibly
    ``b""``), ``finish`` the rest at the end of the context, ``close`` releases it unfinished."""

    @abc.abstractmethod
    def write(self, samples_f32: npt.ArrayLike) -> bytes: ...

    def finish(self) -> bytes:
        return b""

    def close(self) -> None:
        return None


class _RawStreamEncoder(StreamEncoder):
    def __init__(self, encoding: str) -> None:
        if encoding not in SUPPORTED_ENCODINGS:
            raise ValueError(
                f"unsupported encoding {encoding!r}; expected one of {SUPPORTED_ENCODINGS}"
            )
        self._encoding = encoding

    def write(self, samples_f32: npt.ArrayLike) -> bytes:
        return encode_samples(samples_f32, self._encoding)


class _ContainerStreamEncoder(StreamEncoder):
    def __init__(self, encoder: ContainerEncoder) -> None:
        self._encoder = encoder

    def write(self, samples_f32: npt.ArrayLike) -> bytes:
        return self._encoder.write(samples_f32)

    def finish(self) -> bytes:
        return self._encoder.finish()

    def close(self) -> None:
        self._encoder.close()


def make_stream_encoder(
    encoding: str, sample_rate_hz: int, bit_rate_bps: int | None = None
) -> StreamEncoder:
    """An encoder for one context: a raw encoding of :data:`SUPPORTED_ENCODINGS` (each chunk
    encoded alone), or ``mp3`` (one MPEG audio stream for the whole context: its frames are
    returned as the codec completes them, and the codec's last frame at ``finish``)."""
    if encoding in STREAM_CONTAINERS:
        return _ContainerStreamEncoder(
            make_container_encoder(encoding, sample_rate_hz, bit_rate_bps)
        )
    return _RawStreamEncoder(encoding)
