"""The Fish Audio API's TTS request — the body of ``POST /v1/tts`` and the ``request`` of the
live socket's ``start`` — validated field by field into what streamtts does with it. Pure.

Field by field (docs/protocol.md, "Fish Audio API"):

- ``text``; ``format`` (``wav`` ``pcm`` ``mp3`` ``opus``), ``sample_rate``, and the bit rate of
  the chosen format (``mp3_bitrate`` for mp3, ``opus_bitrate`` for opus): how the audio is
  encoded;
- ``reference_id``: a voice id (``GET /v1/voices``); ``references``: inline reference audio,
  validated here, refused by the stream's opening until the engine can take a one-off voice;
- options, through the one option table (``streamtts.options``): ``prosody.speed`` → ``speed``,
  ``top_p``, ``temperature``, ``repetition_penalty``, ``seed``, and ``max_new_tokens`` →
  ``max_frames_per_segment``; values equal to their defaults ask for nothing;
- transport fields (:data:`streamtts.options.TRANSPORT_FIELDS` ``["fish"]``), which change nothing
  about the audio; and a few Fish controls no engine here has, accepted at their default value
  only (``prosody.volume`` 0, ``condition_on_previous_chunks`` true, ``early_stop_threshold`` 1).

The SDKs always send most fields, the legacy one with ``null`` for unset ones: ``null`` is unset
everywhere. An unknown field is refused.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson

from streamtts.audio import MAX_SAMPLE_RATE_HZ, MIN_SAMPLE_RATE_HZ
from streamtts.options import TRANSPORT_FIELDS, OptionError, SynthesisOptions, parse_options
from streamtts.protocol import ErrorCode

FORMATS = ("wav", "pcm", "mp3", "opus")
DEFAULT_FORMAT = "wav"  # upstream fish-speech's default
MP3_BITRATES_KBPS = (64, 128, 192)
OPUS_BITRATES_KBPS = (-1000, 24, 32, 48, 64)  # -1000: the encoder's choice
OPUS_AUTO_BITRATE = -1000
LATENCIES = ("normal", "balanced")
CHUNK_LENGTH_RANGE = (100, 1000)  # upstream's bounds; the SDKs send 100..300
# max_new_tokens: the SDK's default (1024) and upstream's 0 ("no limit") mean the server's own
# max_frames_per_segment.
MAX_NEW_TOKENS_DEFAULTS = (0, 1024)
DEFAULT_ONLY: dict[str, bool | float] = {
    "condition_on_previous_chunks": True,
    "early_stop_threshold": 1.0,
}
_OPTION_FIELDS = ("top_p", "temperature", "repetition_penalty", "seed")
# The request fields the option table's options come from, where the names differ.
OPTION_FIELDS = {"speed": "prosody.speed", "max_frames_per_segment": "max_new_tokens"}
MSGPACK_CONTENT_TYPES = ("application/msgpack", "application/x-msgpack")
_FIELDS = {
    "text",
    "format",
    "sample_rate",
    "mp3_bitrate",
    "opus_bitrate",
    "references",
    "reference_id",
    "prosody",
    "max_new_tokens",
    *_OPTION_FIELDS,
    *DEFAULT_ONLY,
}
_TRANSPORT = TRANSPORT_FIELDS["fish"]


class FishRequestError(ValueError):
    """A field is missing, of the wrong type, out of range, or unknown (``field`` names it), or
    the body is not msgpack / JSON; ``code`` is the documented error code, ``status`` the HTTP
    status ``POST /v1/tts`` answers (400, or the voice library's for a refused reference)."""

    def __init__(
        self,
        field: str | None,
        message: str,
        code: ErrorCode = ErrorCode.INVALID_FIELD,
        status: int = 400,
    ) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.code = code
        self.status = status


@dataclass(frozen=True)
class Reference:
    """One inline reference: audio (a file's bytes) and its transcript."""

    audio: bytes
    text: str


@dataclass(frozen=True)
class FishTtsRequest:
    text: str
    format: str
    sample_rate_hz: int | None  # None: the engine's own rate (opus: always 48 kHz)
    bit_rate_bps: int | None  # the chosen format's bit rate; None: the encoder's default
    voice: str | None  # reference_id; None: the default voice
    references: tuple[Reference, ...]
    options: SynthesisOptions


def parse_request(body: Any, max_text_chars: int, *, require_text: bool) -> FishTtsRequest:
    """Validate a request (a decoded msgpack or JSON map). ``require_text``: a non-empty
    ``text`` (HTTP); the live ``start`` carries ``""``. Raises :class:`FishRequestError`."""
    if not isinstance(body, Mapping):
        raise FishRequestError(
            None,
            "the request must be a map (msgpack) or an object (JSON)",
            ErrorCode.INVALID_MESSAGE,
        )
    unknown = sorted(str(k) for k in body if k not in _FIELDS and k not in _TRANSPORT)
    if unknown:
        raise FishRequestError(unknown[0], f"unknown field {unknown[0]!r}")
    text = _text(body.get("text"), max_text_chars, require_text)
    fmt = _choice(body, "format", FORMATS, DEFAULT_FORMAT)
    _check_transport(body)
    for name, default in DEFAULT_ONLY.items():
        value = body.get(name)
        if value is not None and (type(value) is not type(default) or value != default):
            shown = str(default).lower()
            raise FishRequestError(
                name, f"'{name}' can only be {shown}: no engine here has that control"
            )
    return FishTtsRequest(
        text=text,
        format=fmt,
        sample_rate_hz=_sample_rate(body.get("sample_rate")),
        bit_rate_bps=_bit_rate(body, fmt),
        voice=_reference_id(body.get("reference_id")),
        references=_references(body.get("references")),
        options=_options(body),
    )


def _text(value: Any, limit: int, required: bool) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise FishRequestError("text", "'text' must be a string")
    if required and not value.strip():
        raise FishRequestError("text", "'text' must not be empty")
    if len(value) > limit:
        raise FishRequestError("text", f"'text' has {len(value)} characters; the limit is {limit}")
    return value


def _choice(body: Mapping[str, Any], name: str, allowed: tuple[Any, ...], default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or value not in allowed:
        shown = ", ".join(str(a) for a in allowed)
        raise FishRequestError(name, f"'{name}' must be one of {shown}")
    return value


def _check_transport(body: Mapping[str, Any]) -> None:
    _choice(body, "latency", LATENCIES, None)
    _choice(body, "use_memory_cache", ("on", "off"), None)
    for name in ("normalize", "streaming"):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise FishRequestError(name, f"'{name}' must be true or false")
    low, high = CHUNK_LENGTH_RANGE
    _integer(body.get("chunk_length"), "chunk_length", low, high)
    _integer(body.get("min_chunk_length"), "min_chunk_length", 0, high)


def _integer(value: Any, name: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FishRequestError(name, f"'{name}' must be an integer")
    if not low <= value <= high:
        raise FishRequestError(name, f"'{name}' must be {low}..{high}")
    return value


def _sample_rate(value: Any) -> int | None:
    return _integer(value, "sample_rate", MIN_SAMPLE_RATE_HZ, MAX_SAMPLE_RATE_HZ)


def _bit_rate(body: Mapping[str, Any], fmt: str) -> int | None:
    mp3 = _choice(body, "mp3_bitrate", MP3_BITRATES_KBPS, None)
    opus = _choice(body, "opus_bitrate", OPUS_BITRATES_KBPS, None)
    if fmt == "mp3" and mp3 is not None:
        return int(mp3) * 1000
    if fmt == "opus" and opus not in (None, OPUS_AUTO_BITRATE):
        return int(opus) * 1000
    return None  # the other formats have no bit rate; pcm and wav are 16-bit PCM


def _reference_id(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise FishRequestError("reference_id", "'reference_id' must be a string")
    return value


def _references(value: Any) -> tuple[Reference, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise FishRequestError("references", "'references' must be a list")
    references = []
    for i, item in enumerate(value):
        where = f"references[{i}]"
        if not isinstance(item, Mapping) or set(item) != {"audio", "text"}:
            raise FishRequestError(where, f"'{where}' must be a map of 'audio' and 'text'")
        audio, text = item["audio"], item["text"]
        if isinstance(audio, str):  # JSON bodies carry the bytes as base64
            try:
                audio = base64.b64decode(audio, validate=True)
            except (binascii.Error, ValueError):
                raise FishRequestError(f"{where}.audio", f"'{where}.audio' is not base64") from None
        if not isinstance(audio, bytes) or not audio:
            raise FishRequestError(f"{where}.audio", f"'{where}.audio' must be non-empty bytes")
        if not isinstance(text, str):
            raise FishRequestError(f"{where}.text", f"'{where}.text' must be a string")
        references.append(Reference(audio, text))
    return tuple(references)


def _options(body: Mapping[str, Any]) -> SynthesisOptions:
    raw: dict[str, Any] = {name: body.get(name) for name in _OPTION_FIELDS}
    prosody = body.get("prosody")
    if prosody is not None:
        if not isinstance(prosody, Mapping) or not set(prosody) <= {"speed", "volume"}:
            raise FishRequestError("prosody", "'prosody' must be a map of 'speed' and 'volume'")
        volume = prosody.get("volume")
        if volume is not None and (
            isinstance(volume, bool) or not isinstance(volume, int | float) or volume != 0
        ):
            raise FishRequestError(
                "prosody.volume", "'prosody.volume' can only be 0: no volume change is supported"
            )
        raw["speed"] = prosody.get("speed")
    max_new_tokens = body.get("max_new_tokens")
    if max_new_tokens not in MAX_NEW_TOKENS_DEFAULTS or isinstance(max_new_tokens, bool):
        raw["max_frames_per_segment"] = max_new_tokens
    try:
        return parse_options(raw)
    except OptionError as exc:
        raise FishRequestError(*option_error(exc.option, exc.message)) from None


def option_error(option: str, message: str) -> tuple[str, str]:
    """(field, message) of an option's error in the Fish request's own terms."""
    field = OPTION_FIELDS.get(option, option)
    return field, (message if field == option else f"{field}: {message}")


def decode_body(raw: bytes, content_type: str) -> Any:
    """A request body: msgpack when the content type says so, else JSON."""
    media_type = content_type.split(";")[0].strip().lower()
    if media_type in MSGPACK_CONTENT_TYPES:
        try:
            return msgpack.unpackb(raw, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise FishRequestError(
                None, f"the body is not valid msgpack: {exc}", ErrorCode.INVALID_JSON
            ) from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise FishRequestError(
            None, f"the body is not valid JSON: {exc}", ErrorCode.INVALID_JSON
        ) from None
