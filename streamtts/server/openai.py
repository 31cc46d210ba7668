"""OpenAI-compatible ``POST /v1/audio/speech`` and ``GET /v1/models``.

Wire format per the OpenAI API: JSON body ``{model, input, voice, response_format, speed,
stream_format}``; the body streams as audio is made. ``pcm`` is 24 kHz s16le mono without a
header. Errors use OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``.

Each request in flight holds one admission ticket (``max_active_contexts``); when none is free,
or the engine has no slot, the answer is 429 with ``Retry-After``. While the server drains for
shutdown, new requests get 503.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from streamtts.audio import content_type
from streamtts.config import Settings
from streamtts.engine.base import (
    ClonedVoice,
    Engine,
    EngineError,
    OverloadedError,
)
from streamtts.options import (
    TRANSPORT_FIELDS,
    OptionError,
    SynthesisOptions,
    describe_options,
    parse_options,
)
from streamtts.server.admission import RETRY_AFTER_S
from streamtts.server.errors import wire_error
from streamtts.server.http_audio import encoded_audio
from streamtts.server.state import AppState
from streamtts.voices.catalog import VoiceCatalog

OPENAI_SAMPLE_RATE_HZ = 24_000
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx",
    "nova", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# The request fields: the input and voice, the option table's ``speed``, the response format,
# ``instructions`` (refused unless empty: no engine takes style instructions), and the
# transport fields of the option table.
_FIELDS = {"input", "voice", "response_format", "speed", "instructions"}
_TRANSPORT = TRANSPORT_FIELDS["openai"]


def openai_error(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _overloaded(message: str) -> JSONResponse:
    return openai_error(
        429, message, None, "overloaded", headers={"Retry-After": str(RETRY_AFTER_S)}
    )


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass(frozen=True)
class SpeechRequest:
    input: str
    voice: str | ClonedVoice
    format: str
    options: SynthesisOptions
    sse: bool


def models_response(engine: Engine) -> JSONResponse:
    """The server's model (with the options it takes and what runs it), then the OpenAI model
    names it answers to."""
    options = describe_options(engine.kind)
    served = {
        "id": engine.name,
        "object": "model",
        "created": 0,
        "owned_by": "streamtts",
        "options": options,
        "engine": engine.describe(),
    }
    aliases = [
        {"id": i, "object": "model", "created": 0, "owned_by": "streamtts", "options": options}
        for i in MODEL_ALIASES
    ]
    return JSONResponse({"object": "list", "data": [served, *aliases]})


async def speech(request: Request, state: AppState) -> Response:
    engine, settings, metrics = state.engine, state.settings, state.metrics
    if state.lifecycle.draining:
        metrics.rejected_total.labels("shutting_down").inc()
        return openai_error(
            503, "the server is shutting down", None, "shutting_down", {"Retry-After": "1"}
        )
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return openai_error(400, "the request body is not valid JSON", code="invalid_json")
    if isinstance(body, dict):
        await state.voices.refresh_on_miss(_voice_id(body.get("voice")))
    try:
        req = _validate(body, state.voices, settings)
    except _BadRequest as exc:
        return openai_error(400, exc.message, exc.param, exc.code)
    ticket = state.admission.try_acquire()
    if ticket is None:
        metrics.errors_total.labels("overloaded").inc()
        return _overloaded(
            f"the server is at its capacity of {state.admission.capacity} streams; retry shortly"
        )
    try:
        stream = engine.open_stream(req.voice, req.options)
    except EngineError as exc:
        ticket.release()
        wire = wire_error(exc)
        metrics.errors_total.labels(wire.code).inc()
        if isinstance(exc, OverloadedError):
            return _overloaded(wire.message)
        return openai_error(wire.http_status, wire.message, wire.param, wire.code)
    audio = encoded_audio(stream, ticket, state, req.input, req.format, OPENAI_SAMPLE_RATE_HZ)
    if req.sse:
        return StreamingResponse(_sse_events(audio), media_type="text/event-stream")
    return StreamingResponse(
        audio, media_type=content_type(req.format), headers={"X-Accel-Buffering": "no"}
    )


def _validate(body: Any, voices: VoiceCatalog, settings: Settings) -> SpeechRequest:
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object", None, "invalid_type")
    unknown = sorted(set(body) - _FIELDS - set(_TRANSPORT))
    if unknown:
        raise _BadRequest(
            f"unknown parameter {unknown[0]!r}; streamtts takes "
            f"{', '.join(sorted(_FIELDS | set(_TRANSPORT)))}",
            unknown[0],
            "unknown_parameter",
        )
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise _BadRequest("'input' must be a non-empty string", "input", "invalid_type")
    limit = settings.limits.max_http_input_chars
    if len(text) > limit:
        raise _BadRequest(
            f"'input' has {len(text)} characters; the maximum is {limit}",
            "input",
            "string_above_max_length",
        )
    fmt = body.get("response_format", "mp3")
    if fmt not in RESPONSE_FORMATS:
        raise _BadRequest(
            f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}", "response_format"
        )
    if body.get("instructions") not in (None, ""):
        raise _BadRequest(
            "'instructions' are not supported: this server's voices take no style instructions",
            "instructions",
            "unsupported_parameter",
        )
    try:
        options = parse_options({"speed": body.get("speed")})
    except OptionError as exc:
        raise _BadRequest(exc.message, "speed") from None
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise _BadRequest("'stream_format' must be 'audio' or 'sse'", "stream_format")
    if body.get("stream", True) is not True:
        raise _BadRequest("'stream' must be true: the body always streams", "stream")
    return SpeechRequest(
        text, _resolve_voice(body.get("voice"), voices), fmt, options, stream_format == "sse"
    )


def _voice_id(voice: Any) -> Any:
    return voice.get("id") if isinstance(voice, dict) else voice


def _resolve_voice(voice: Any, voices: VoiceCatalog) -> str | ClonedVoice:
    """Our voice ids (built-in and cloned) pass through; OpenAI's built-in names map to the
    default voice so existing clients work unchanged."""
    voice = _voice_id(voice)
    if voice is None or voice in OPENAI_VOICES:
        voice = "default"
    if not isinstance(voice, str) or voice not in voices:
        raise _BadRequest(f"unknown voice {voice!r}; GET /v1/voices lists them", "voice")
    return voices.resolve(voice)


async def _sse_events(audio: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in audio:
        event = {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
        yield b"data: " + orjson.dumps(event) + b"\n\n"
    done = {"type": "speech.audio.done"}
    yield b"data: " + orjson.dumps(done) + b"\n\n"
