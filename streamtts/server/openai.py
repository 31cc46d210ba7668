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
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from streamtts.audio import StreamingResampler, content_type, make_container_encoder
from streamtts.config import Settings
from streamtts.engine.base import Engine, EngineError, EngineStream, SynthesisOptions
from streamtts.segmenter import segment_text
from streamtts.server.admission import RETRY_AFTER_S, Ticket
from streamtts.server.state import AppState

OPENAI_SAMPLE_RATE_HZ = 24_000
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx",
    "nova", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
SPEED_RANGE = (0.25, 4.0)


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


def models_response(engine: Engine) -> JSONResponse:
    ids = [engine.name, *MODEL_ALIASES]
    data = [{"id": i, "object": "model", "created": 0, "owned_by": "streamtts"} for i in ids]
    return JSONResponse({"object": "list", "data": data})


async def speech(request: Request, state: AppState) -> Response:
    engine, settings, metrics = state.engine, state.settings, state.metrics
    if state.lifecycle.draining:
        metrics.rejected_total.inc("shutting_down")
        return openai_error(
            503, "the server is shutting down", None, "shutting_down", {"Retry-After": "1"}
        )
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return openai_error(400, "the request body is not valid JSON", code="invalid_json")
    try:
        req = _validate(body, engine, settings)
    except _BadRequest as exc:
        return openai_error(400, exc.message, exc.param, exc.code)
    ticket = state.admission.try_acquire()
    if ticket is None:
        metrics.errors_total.inc("overloaded")
        return _overloaded(
            f"the server is at its limit of {state.admission.limit} active streams; retry shortly"
        )
    try:
        stream = engine.open_stream(req["voice"], SynthesisOptions(speed=req["speed"]))
    except EngineError as exc:
        ticket.release()
        metrics.errors_total.inc(exc.code)
        if exc.code == "overloaded":
            return _overloaded(str(exc))
        return openai_error(400, str(exc), "voice", exc.code)
    fmt: str = req["format"]
    audio = _encoded_audio(stream, ticket, state, req["input"], fmt)
    if req["sse"]:
        return StreamingResponse(_sse_events(audio), media_type="text/event-stream")
    return StreamingResponse(
        audio, media_type=content_type(fmt), headers={"X-Accel-Buffering": "no"}
    )


def _validate(body: Any, engine: Engine, settings: Settings) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object", None, "invalid_type")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise _BadRequest("'input' must be a non-empty string", "input", "invalid_type")
    if len(text) > settings.max_http_input_chars:
        raise _BadRequest(
            f"'input' has {len(text)} characters; the maximum is {settings.max_http_input_chars}",
            "input",
            "string_above_max_length",
        )
    fmt = body.get("response_format", "mp3")
    if fmt not in RESPONSE_FORMATS:
        raise _BadRequest(
            f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}", "response_format"
        )
    speed = body.get("speed", 1.0)
    if not isinstance(speed, int | float) or isinstance(speed, bool):
        raise _BadRequest("'speed' must be a number", "speed", "invalid_type")
    if not SPEED_RANGE[0] <= speed <= SPEED_RANGE[1]:
        raise _BadRequest(f"'speed' must be within {SPEED_RANGE[0]}..{SPEED_RANGE[1]}", "speed")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise _BadRequest("'stream_format' must be 'audio' or 'sse'", "stream_format")
    return {
        "input": text,
        "voice": _resolve_voice(body.get("voice"), engine),
        "format": fmt,
        "speed": float(speed),
        "sse": stream_format == "sse",
    }


def _resolve_voice(voice: Any, engine: Engine) -> str:
    """Our voice ids pass through; OpenAI's built-in names map to the default voice so existing
    clients work unchanged."""
    if isinstance(voice, dict):
        voice = voice.get("id")
    if voice is None or voice in OPENAI_VOICES or voice == "default":
        return engine.default_voice
    if not isinstance(voice, str) or voice not in {v.id for v in engine.voices()}:
        raise _BadRequest(f"unknown voice {voice!r}; GET /v1/voices lists them", "voice")
    return voice


async def _encoded_audio(
    stream: EngineStream, ticket: Ticket, state: AppState, text: str, fmt: str
) -> AsyncIterator[bytes]:
    engine, settings = state.engine, state.settings
    expired = state.lifecycle.expired
    reason = "disconnect"
    segments = segment_text(text, settings.segmenter_options())
    resampler = StreamingResampler(engine.sample_rate, OPENAI_SAMPLE_RATE_HZ)
    encoder = make_container_encoder(fmt, OPENAI_SAMPLE_RATE_HZ)
    try:
        for text_segment in segments:
            async for pcm in stream.synthesize(text_segment):
                if expired.is_set():  # shutdown grace is over: end the body here
                    reason = "shutdown"
                    return
                out = encoder.write(resampler.process(pcm))
                if out:
                    yield out
        tail = encoder.write(resampler.flush()) + encoder.finish()
        if tail:
            yield tail
        reason = "end"
    except EngineError as exc:
        reason = "error"
        state.metrics.errors_total.inc(exc.code)
        raise
    finally:
        # Runs on completion and when the client disconnects mid-body (generator closed).
        stream.close()
        ticket.release()
        state.metrics.contexts_total.inc(reason)


async def _sse_events(audio: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in audio:
        event = {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
        yield b"data: " + orjson.dumps(event) + b"\n\n"
    done = {"type": "speech.audio.done"}
    yield b"data: " + orjson.dumps(done) + b"\n\n"
