"""Tests for streamtts.audio: raw encodings, G.711, resampling, container encoders."""

from __future__ import annotations

import importlib
import io
import warnings
import wave
from collections.abc import Iterator
from types import ModuleType

import av
import numpy as np
import numpy.typing as npt
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.audio import (
    BYTES_PER_SAMPLE,
    CONTAINER_FORMATS,
    MAX_SAMPLE_RATE_HZ,
    MIN_SAMPLE_RATE_HZ,
    OPUS_SAMPLE_RATE_HZ,
    S16_FULL_SCALE,
    SUPPORTED_ENCODINGS,
    WAV_HEADER_BYTES,
    ContainerEncoder,
    StreamingResampler,
    content_type,
    decode_samples,
    encode_samples,
    make_container_encoder,
    wav_header,
)

Floats = npt.NDArray[np.float32]
RATES_HZ = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000)


def sine(duration_s: float, rate_hz: int, freq_hz: float = 440.0, amp: float = 0.5) -> Floats:
    t_s = np.arange(round(duration_s * rate_hz)) / rate_hz
    return (amp * np.sin(2 * np.pi * freq_hz * t_s)).astype(np.float32)


def all_s16() -> npt.NDArray[np.int16]:
    return np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)


def s16_as_float(v: npt.NDArray[np.int16]) -> Floats:
    return (v.astype(np.float32) / np.float32(S16_FULL_SCALE)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Constants and raw encodings
# --------------------------------------------------------------------------------------------


def test_constants() -> None:
    assert SUPPORTED_ENCODINGS == ("pcm_s16le", "pcm_f32le", "mulaw", "alaw")
    assert (MIN_SAMPLE_RATE_HZ, MAX_SAMPLE_RATE_HZ) == (8000, 48000)
    assert BYTES_PER_SAMPLE == {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}


@pytest.mark.parametrize("encoding", SUPPORTED_ENCODINGS)
@pytest.mark.parametrize("rate_hz", RATES_HZ)
def test_byte_count_for_known_duration(encoding: str, rate_hz: int) -> None:
    duration_ms = 1250
    samples = sine(duration_ms / 1000, rate_hz)
    data = encode_samples(samples, encoding)
    assert len(data) == rate_hz * duration_ms // 1000 * BYTES_PER_SAMPLE[encoding]
    assert decode_samples(data, encoding).shape == samples.shape


@pytest.mark.parametrize("encoding", SUPPORTED_ENCODINGS)
def test_empty_input(encoding: str) -> None:
    assert encode_samples(np.zeros(0, np.float32), encoding) == b""
    assert decode_samples(b"", encoding).size == 0


def test_unknown_encoding() -> None:
    with pytest.raises(ValueError):
        encode_samples(np.zeros(4, np.float32), "pcm_u8")
    with pytest.raises(ValueError):
        decode_samples(b"\0\0", "opus")
    with pytest.raises(ValueError):
        decode_samples(b"\0\0\0", "pcm_s16le")  # not a whole number of samples


def test_s16_scaling() -> None:
    x = np.array([0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 1e-6, np.nan, np.inf, -np.inf], np.float32)
    v = np.frombuffer(encode_samples(x, "pcm_s16le"), "<i2")
    assert v.tolist() == [0, 32767, -32767, 32767, -32767, 16384, 0, 0, 32767, -32767]


def test_s16_round_trip_is_exact_for_16_bit_values() -> None:
    v = all_s16()[1:]  # -32768 is never produced by the encoder
    data = encode_samples(s16_as_float(v), "pcm_s16le")
    assert np.array_equal(np.frombuffer(data, "<i2"), v)


def test_f32_is_little_endian_and_clipped() -> None:
    x = np.array([0.25, -0.5, 3.0, np.nan], np.float32)
    data = encode_samples(x, "pcm_f32le")
    assert data[:4] == np.float32(0.25).astype("<f4").tobytes()
    assert decode_samples(data, "pcm_f32le").tolist() == [0.25, -0.5, 1.0, 0.0]


def test_encode_accepts_other_dtypes_and_shapes() -> None:
    x64 = np.linspace(-1, 1, 101)
    assert encode_samples(x64, "pcm_s16le") == encode_samples(x64.astype(np.float32), "pcm_s16le")
    assert encode_samples(x64[None, :], "mulaw") == encode_samples(x64, "mulaw")


# --------------------------------------------------------------------------------------------
# G.711
# --------------------------------------------------------------------------------------------

# Reconstruction values (16-bit units) of the published G.711 decode tables (as in the ITU-T
# G.191 reference and every telephony stack): codes 0..19 and 120..127 of μ-law, codes 0..31
# and 80..87 of A-law; codes 128..255 are the same magnitudes, positive.
ULAW_DECODE_0_19 = [
    -32124, -31100, -30076, -29052, -28028, -27004, -25980, -24956, -23932, -22908,
    -21884, -20860, -19836, -18812, -17788, -16764, -15996, -15484, -14972, -14460,
]  # fmt: skip
ULAW_DECODE_120_127 = [-56, -48, -40, -32, -24, -16, -8, 0]
ALAW_DECODE_0_31 = [
    -5504, -5248, -6016, -5760, -4480, -4224, -4992, -4736,
    -7552, -7296, -8064, -7808, -6528, -6272, -7040, -6784,
    -2752, -2624, -3008, -2880, -2240, -2112, -2496, -2368,
    -3776, -3648, -4032, -3904, -3264, -3136, -3520, -3392,
]  # fmt: skip
ALAW_DECODE_80_87 = [-88, -72, -120, -104, -24, -8, -56, -40]


def decode16(codes: list[int], encoding: str) -> list[int]:
    x = decode_samples(bytes(codes), encoding)
    return [int(v) for v in np.rint(x * S16_FULL_SCALE)]


def test_ulaw_decode_table() -> None:
    assert decode16(list(range(20)), "mulaw") == ULAW_DECODE_0_19
    assert decode16(list(range(120, 128)), "mulaw") == ULAW_DECODE_120_127
    # Positive half mirrors the negative half; both zeros decode to 0.
    negative = decode16(list(range(128)), "mulaw")
    positive = decode16(list(range(128, 256)), "mulaw")
    assert positive == [-v for v in negative]
    assert decode16([0x7F, 0xFF], "mulaw") == [0, 0]
    # Step size doubles per segment: 8, 16, ..., 1024 (16-bit units).
    steps = np.diff(positive[::-1])  # codes 255 → 128: increasing magnitude
    seg_steps = [steps[16 * s + 1 : 16 * s + 15] for s in range(8)]
    for s, st_ in enumerate(seg_steps):
        assert set(st_.tolist()) == {8 << s}


def test_alaw_decode_table() -> None:
    assert decode16(list(range(32)), "alaw") == ALAW_DECODE_0_31
    assert decode16(list(range(80, 88)), "alaw") == ALAW_DECODE_80_87
    negative = decode16(list(range(128)), "alaw")
    positive = decode16(list(range(128, 256)), "alaw")
    assert positive == [-v for v in negative]
    # A-law has no zero code: the smallest magnitudes are ±8 (codes 0xD5 / 0x55).
    assert decode16([0xD5, 0x55], "alaw") == [8, -8]
    assert min(abs(v) for v in positive) == 8
    assert max(positive) == 32256


def test_g711_sign_and_zero_codes() -> None:
    zero_and_extremes = np.array([0.0, 1.0, -1.0, 1e-6, -1e-6], np.float32)
    # Silence: μ-law 0xFF (positive zero), A-law 0xD5 (smallest positive, even bits inverted).
    assert encode_samples(zero_and_extremes, "mulaw") == bytes([0xFF, 0x80, 0x00, 0xFF, 0xFF])
    assert encode_samples(zero_and_extremes, "alaw") == bytes([0xD5, 0xAA, 0x2A, 0xD5, 0xD5])
    # Sign bit: μ-law and A-law both use bit 7 = 1 for positive samples.
    x = np.linspace(-1, 1, 1001).astype(np.float32)
    for enc in ("mulaw", "alaw"):
        codes = np.frombuffer(encode_samples(x, enc), np.uint8)
        pos = x > 0.01
        neg = x < -0.01
        assert np.all(codes[pos] & 0x80)
        assert not np.any(codes[neg] & 0x80)


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_g711_encode_decode_fixed_point(encoding: str) -> None:
    """Every reconstruction value encodes back to its own code (except μ-law -0 → +0)."""
    codes = np.arange(256, dtype=np.uint8)
    again = np.frombuffer(
        encode_samples(decode_samples(codes.tobytes(), encoding), encoding), np.uint8
    )
    expected = codes.copy()
    if encoding == "mulaw":
        expected[0x7F] = 0xFF
    assert np.array_equal(again, expected)


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_g711_monotonic_and_error_bound(encoding: str) -> None:
    v = all_s16()
    x = s16_as_float(v)
    y16 = np.rint(decode_samples(encode_samples(x, encoding), encoding) * S16_FULL_SCALE)
    y16 = y16.astype(np.int64)
    # Monotonic, odd-symmetric quantiser.
    assert np.all(np.diff(y16) >= 0)
    # Quantiser: every sample inside the table's range decodes to one of the two
    # reconstruction levels that bracket it; outside it decodes to the extreme level.
    levels = np.unique(decode16(list(range(256)), encoding))
    v64 = v.astype(np.int64)
    inside = (v64 > levels[0]) & (v64 < levels[-1])
    idx = np.searchsorted(levels, v64[inside])
    lo, hi = levels[idx - 1], levels[idx]
    assert np.all((y16[inside] == lo) | (y16[inside] == hi))
    assert np.all(y16[v64 >= levels[-1]] == levels[-1])
    assert np.all(y16[v64 <= levels[0]] == levels[0])
    err = np.abs(y16 - v64)
    mag = np.abs(v64)
    # Relative error of a log quantiser: well under 7 % above the first two segments.
    big = mag > 1024
    assert np.max(err[big] / mag[big]) < 0.07


def optional_audioop() -> ModuleType | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return importlib.import_module("audioop")
        except ImportError:  # removed in Python 3.13
            return None


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_g711_matches_reference_implementation(encoding: str) -> None:
    """CPython's audioop implements the G.191 reference; we are byte-identical to it."""
    audioop = optional_audioop()
    if audioop is None:
        pytest.skip("audioop is not available (Python ≥ 3.13)")
    v = all_s16()[1:]  # -32768 is not reachable from our float scaling
    lin2x = audioop.lin2ulaw if encoding == "mulaw" else audioop.lin2alaw
    x2lin = audioop.ulaw2lin if encoding == "mulaw" else audioop.alaw2lin
    assert encode_samples(s16_as_float(v), encoding) == lin2x(v.astype("<i2").tobytes(), 2)
    codes = bytes(range(256))
    ref = np.frombuffer(x2lin(codes, 2), "<i2")
    assert decode16(list(codes), encoding) == ref.tolist()


# --------------------------------------------------------------------------------------------
# Resampler
# --------------------------------------------------------------------------------------------


def run_resampler(resampler: StreamingResampler, chunks: list[Floats]) -> Floats:
    out = [resampler.process(c) for c in chunks]
    out.append(resampler.flush())
    return np.concatenate(out)


def chunked(x: Floats, sizes: list[int]) -> list[Floats]:
    chunks: list[Floats] = []
    pos = 0
    for size in sizes:
        chunks.append(x[pos : pos + size])
        pos += size
    chunks.append(x[pos:])
    return chunks


@given(
    in_rate_hz=st.integers(MIN_SAMPLE_RATE_HZ, MAX_SAMPLE_RATE_HZ),
    out_rate_hz=st.integers(MIN_SAMPLE_RATE_HZ, MAX_SAMPLE_RATE_HZ),
    sizes=st.lists(st.integers(0, 5000), max_size=12),
)
@settings(max_examples=150, deadline=None)
def test_resampler_total_length(in_rate_hz: int, out_rate_hz: int, sizes: list[int]) -> None:
    n_in = sum(sizes)
    x = np.zeros(n_in, np.float32)
    y = run_resampler(StreamingResampler(in_rate_hz, out_rate_hz), chunked(x, sizes))
    assert y.dtype == np.float32
    assert abs(y.size - round(n_in * out_rate_hz / in_rate_hz)) <= 1


@pytest.mark.parametrize("in_rate_hz", [16000, 22050, 24000, 44100])
@pytest.mark.parametrize("out_rate_hz", RATES_HZ)
def test_resampler_length_common_pairs(in_rate_hz: int, out_rate_hz: int) -> None:
    rng = np.random.default_rng(in_rate_hz + out_rate_hz)
    x = sine(1.7, in_rate_hz)
    sizes = rng.integers(1, 3000, size=40).tolist()
    y = run_resampler(StreamingResampler(in_rate_hz, out_rate_hz), chunked(x, sizes))
    assert abs(y.size - round(x.size * out_rate_hz / in_rate_hz)) <= 1


def test_resampler_chunking_does_not_change_the_output() -> None:
    x = sine(1.0, 44100, 300.0)
    whole = run_resampler(StreamingResampler(44100, 24000), [x])
    pieces = run_resampler(StreamingResampler(44100, 24000), chunked(x, [1, 2047, 300, 5000]))
    assert whole.shape == pieces.shape
    np.testing.assert_allclose(whole, pieces, atol=1e-6)


def test_resampler_preserves_a_tone() -> None:
    x = sine(1.0, 44100, 1000.0, amp=0.5)
    y = run_resampler(StreamingResampler(44100, 16000), [x])
    ref = sine(1.0, 16000, 1000.0, amp=0.5)
    mid = slice(800, 15200)  # skip the filter's edge transients
    np.testing.assert_allclose(y[mid], ref[mid], atol=2e-3)


def test_resampler_identity() -> None:
    r = StreamingResampler(24000, 24000)
    assert r.is_identity
    x = sine(0.1, 24000)
    y = r.process(x)
    assert np.array_equal(x, y) and y is not x
    assert r.process(x.astype(np.float64)).dtype == np.float32
    assert r.flush().size == 0


def test_resampler_lifecycle_and_validation() -> None:
    r = StreamingResampler(44100, 24000)
    assert r.process(np.zeros(0, np.float32)).size == 0
    r.process(np.zeros(4410, np.float32))
    assert r.flush().size > 0
    assert r.flush().size == 0  # idempotent
    with pytest.raises(RuntimeError):
        r.process(np.zeros(10, np.float32))
    for bad in (0, -8000):
        with pytest.raises(ValueError):
            StreamingResampler(bad, 24000)
        with pytest.raises(ValueError):
            StreamingResampler(24000, bad)


# --------------------------------------------------------------------------------------------
# Container encoders
# --------------------------------------------------------------------------------------------


def random_chunks(x: Floats, seed: int, max_chunk: int) -> Iterator[Floats]:
    rng = np.random.default_rng(seed)
    pos = 0
    while pos < x.size:
        size = int(rng.integers(1, max_chunk))
        yield x[pos : pos + size]
        pos += size


def encode_stream(encoder: ContainerEncoder, x: Floats, max_chunk: int) -> tuple[bytes, int]:
    """Encoded bytes, and how many input samples had been written when bytes first came out."""
    out: list[bytes] = []
    written = 0
    first_at = -1
    for chunk in random_chunks(x, 1, max_chunk):
        data = encoder.write(chunk)
        written += chunk.size
        if data and first_at < 0:
            first_at = written
        out.append(data)
    out.append(encoder.finish())
    return b"".join(out), first_at


def decode_with_av(data: bytes) -> tuple[int, int, Floats]:
    """(samples, sample rate, mono float samples) of an encoded file, decoded by ffmpeg."""
    with av.open(io.BytesIO(data), mode="r") as container:
        pieces: list[Floats] = []
        rate_hz = 0
        for frame in container.decode(audio=0):
            rate_hz = frame.sample_rate
            arr = frame.to_ndarray()
            if arr.dtype.kind in "iu":
                arr = arr / 32768.0
            pieces.append(arr.reshape(frame.layout.nb_channels, -1)[0].astype(np.float32))
    y = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return y.size, rate_hz, y


# Extra samples a lossy codec may add at the end of the stream (encoder delay + final frame
# padding; without a seekable output there is no gapless-playback tag to trim them).
LOSSY_EXTRA_SAMPLES = {"mp3": 2 * 1152, "aac": 2 * 1024}


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac", "aac"])
@pytest.mark.parametrize("rate_hz", [8000, 16000, 22050, 24000, 44100, 48000])
def test_container_round_trip(fmt: str, rate_hz: int) -> None:
    duration_s = 2.0
    x = sine(duration_s, rate_hz, 440.0, amp=0.3)
    encoder = make_container_encoder(fmt, rate_hz)
    data, first_at = encode_stream(encoder, x, max_chunk=rate_hz // 10)
    n, decoded_rate_hz, y = decode_with_av(data)
    expected_rate_hz = OPUS_SAMPLE_RATE_HZ if fmt == "opus" else rate_hz
    assert encoder.output_sample_rate_hz == decoded_rate_hz == expected_rate_hz
    expected_n = round(duration_s * expected_rate_hz)
    assert expected_n - 1 <= n <= expected_n + LOSSY_EXTRA_SAMPLES.get(fmt, 1)
    # Streaming: bytes came out long before the end (≤ ~1 s of audio for the codecs).
    assert 0 < first_at <= rate_hz
    # The content survives (lossless formats exactly to 16 bits; lossy ones by level).
    if fmt in ("wav", "flac"):
        ref = np.rint(x * S16_FULL_SCALE) / 32768.0
        np.testing.assert_allclose(y, ref, atol=1e-6)
    else:
        rms = float(np.sqrt(np.mean(y[n // 4 : 3 * n // 4] ** 2)))
        assert rms == pytest.approx(0.3 / np.sqrt(2), rel=0.1)


def test_pcm_container_is_raw_s16le() -> None:
    x = sine(0.5, 24000)
    encoder = make_container_encoder("pcm", 24000)
    data, first_at = encode_stream(encoder, x, 1000)
    assert data == encode_samples(x, "pcm_s16le")
    assert first_at > 0
    assert encoder.content_type == "application/octet-stream"


def test_wav_header_and_streaming_readers() -> None:
    rate_hz = 24000
    x = sine(0.75, rate_hz)
    encoder = make_container_encoder("wav", rate_hz)
    first = encoder.write(x[:100])
    assert len(first) == WAV_HEADER_BYTES + 200
    assert first[:44] == wav_header(rate_hz)
    assert first[4:8] == b"\xff\xff\xff\xff" and first[40:44] == b"\xff\xff\xff\xff"
    assert first[:4] == b"RIFF" and first[8:16] == b"WAVEfmt " and first[36:40] == b"data"
    data = first + encoder.write(x[100:]) + encoder.finish()
    assert data[44:] == encode_samples(x, "pcm_s16le")
    # Readers accept the unknown-length sentinel and read to the end of the data.
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (rate_hz, 1, 2)
        assert len(w.readframes(10**9)) == 2 * x.size
    y, sr = soundfile.read(io.BytesIO(data), dtype="float32")
    assert sr == rate_hz and y.shape == x.shape


def test_wav_header_with_known_length() -> None:
    header = wav_header(16000, data_bytes=3200)
    assert int.from_bytes(header[4:8], "little") == 36 + 3200
    assert int.from_bytes(header[40:44], "little") == 3200
    assert int.from_bytes(header[28:32], "little") == 32000  # byte rate


def test_empty_wav_stream_is_a_valid_file() -> None:
    encoder = make_container_encoder("wav", 16000)
    data = encoder.finish()
    assert data == wav_header(16000)
    assert encoder.finish() == b""


@pytest.mark.parametrize("fmt", CONTAINER_FORMATS)
def test_container_lifecycle(fmt: str) -> None:
    encoder = make_container_encoder(fmt, 24000)
    assert encoder.format == fmt
    assert encoder.content_type == content_type(fmt)
    encoder.write(np.zeros(0, np.float32))
    encoder.write(sine(0.2, 24000))
    encoder.finish()
    assert encoder.finish() == b""
    with pytest.raises(RuntimeError):
        encoder.write(sine(0.1, 24000))


@pytest.mark.parametrize("fmt", CONTAINER_FORMATS)
def test_container_close_without_finish(fmt: str) -> None:
    encoder = make_container_encoder(fmt, 24000)
    encoder.write(sine(0.3, 24000))
    encoder.close()
    encoder.close()
    assert encoder.finish() == b""
    with pytest.raises(RuntimeError):
        encoder.write(sine(0.1, 24000))


def test_codec_rate_fallback() -> None:
    # 11000 Hz is not an MP3 rate: the encoder resamples to the next one up.
    encoder = make_container_encoder("mp3", 11000)
    assert encoder.output_sample_rate_hz == 11025
    data, _ = encode_stream(encoder, sine(1.0, 11000), 2000)
    n, rate_hz, _ = decode_with_av(data)
    assert rate_hz == 11025 and 11025 <= n <= 11025 + 3 * 1152
    # FLAC and WAV take any rate.
    assert make_container_encoder("flac", 11000).output_sample_rate_hz == 11000


def test_content_types_and_validation() -> None:
    assert {f: content_type(f) for f in CONTAINER_FORMATS} == {
        "pcm": "application/octet-stream",
        "wav": "audio/wav",
        "mp3": "audio/mpeg",
        "opus": "audio/ogg",
        "flac": "audio/flac",
        "aac": "audio/aac",
    }
    with pytest.raises(ValueError):
        content_type("ogg")
    with pytest.raises(ValueError):
        make_container_encoder("ogg", 24000)
    with pytest.raises(ValueError):
        make_container_encoder("wav", 0)


@pytest.mark.parametrize(
    ("fmt", "low_bps", "high_bps"), [("mp3", 64_000, 192_000), ("opus", 24_000, 64_000)]
)
def test_a_bit_rate_sets_the_size_of_the_stream(fmt: str, low_bps: int, high_bps: int) -> None:
    noise = np.random.default_rng(0).uniform(-0.5, 0.5, 48000 * 3).astype(np.float32)
    sizes = []
    for bit_rate_bps in (low_bps, high_bps):
        encoder = make_container_encoder(fmt, 48000, bit_rate_bps)
        data, _ = encode_stream(encoder, noise, 4800)
        sizes.append(len(data))
        assert 2.9 < decode_with_av(data)[0] / decode_with_av(data)[1] < 3.2
    # The encoded size follows the bit rate (3 s of noise; containers add a little).
    assert sizes[1] / sizes[0] == pytest.approx(high_bps / low_bps, rel=0.25)
    for fmt_without in ("pcm", "wav", "flac"):
        with pytest.raises(ValueError, match="no bit rate"):
            make_container_encoder(fmt_without, 24000, 64_000)
