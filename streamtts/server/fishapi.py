"""The Fish Audio API's ``POST /v1/tts``: a msgpack (``Content-Type: application/msgpack``) or
JSON body (``streamtts.fishapi.request``), the audio body streamed as it is synthesised.

Errors are what both modules of ``fish-audio-sdk`` parse: a non-2xx status with the JSON body
``{"status": N, "message": "..."}``. Admission as for OpenAI speech: one ticket per request in
flight, 429 with ``Retry-After`` when none is free or the engine has no slot, 503 while draining.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from streamtts.audio import content_type
from streamtts.engine.base import (
    ClonedVoice,
    EngineError,
    InvalidOptionError,
    OverloadedError,
    UnknownVoiceError,
)
from streamtts.fishapi.request import (
    FishRequestError,
    FishTtsRequest,
    decode_body,
    option_error,
    parse_request,
)
from streamtts.server.admission import RETRY_AFTER_S
from streamtts.server.errors import wire_error
from streamtts.server.http_audio import encoded_audio
from streamtts.server.state import AppState
from streamtts.voices.catalog import DEFAULT_VOICE_ALIAS, VoiceCatalog, VoiceError


def fish_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"status": status, "message": message}, status, headers=headers)


class BodyTooLarge(Exception):
    pass


async def fish_voice(voices: VoiceCatalog, request: FishTtsRequest) -> str | ClonedVoice:
    """The voice a Fish request speaks with: its inline reference (encoded now, not stored),
    else the catalog id of its ``reference_id``, else ``default``. Raises :class:`FishRequestError`
    (``references``, with the voice library's status) or :class:`UnknownVoiceError`."""
    if request.references:
        if len(request.references) > 1:
            raise FishRequestError(
                "references",
                f"{len(request.references)} inline references were sent; one is supported per "
                "request (store more voices with POST /v1/voices and use 'reference_id')",
            )
        reference = request.references[0]
        try:
            return await voices.one_off(reference.audio, reference.text)
        except VoiceError as exc:
            raise FishRequestError(
                "references", f"references[0]: {exc.message}", status=exc.status
            ) from None
    voice = DEFAULT_VOICE_ALIAS if request.voice is None else request.voice
    await voices.refresh_on_miss(voice)  # another replica's voice?
    if voice not in voices:
        raise UnknownVoiceError(f"unknown reference_id {voice!r}; GET /v1/voices lists the voices")
    return voice


def refusal_message(exc: EngineError) -> str:
    """An engine refusal in the Fish request's terms (``prosody.speed``, not ``speed``)."""
    if isinstance(exc, InvalidOptionError):
        return option_error(exc.option, str(exc))[1]
    return wire_error(exc).message


async def tts(request: Request, state: AppState) -> Response:
    engine, settings, metrics = state.engine, state.settings, state.metrics
    if state.lifecycle.draining:
        metrics.rejected_total.labels("shutting_down").inc()
        return fish_error(503, "the server is shutting down", {"Retry-After": str(RETRY_AFTER_S)})
    limit = settings.limits.max_http_body_bytes
    try:
        raw = await _body(request, limit)
    except BodyTooLarge:
        metrics.errors_total.labels("message_too_big").inc()
        return fish_error(413, f"the request body is larger than {limit} bytes")
    except ClientDisconnect:
        return Response(status_code=400)
    try:
        body = decode_body(raw, request.headers.get("content-type", ""))
        req = parse_request(body, settings.limits.max_http_input_chars, require_text=True)
        voice = await fish_voice(state.voices, req)
        if not isinstance(voice, ClonedVoice):
            voice = state.voices.resolve(voice)
    except FishRequestError as exc:
        metrics.errors_total.labels(exc.code).inc()
        return fish_error(exc.status, exc.message)
    except EngineError as exc:
        wire = wire_error(exc)
        metrics.errors_total.labels(wire.code).inc()
        return fish_error(wire.http_status, refusal_message(exc))
    ticket = state.admission.try_acquire()
    if ticket is None:
        metrics.errors_total.labels("overloaded").inc()
        return fish_error(
            429,
            f"the server is at its capacity of {state.admission.capacity} active streams; "
            "retry shortly",
            {"Retry-After": str(RETRY_AFTER_S)},
        )
    try:
        stream = engine.open_stream(voice, req.options)
    except EngineError as exc:
        ticket.release()
        wire = wire_error(exc)
        metrics.errors_total.labels(wire.code).inc()
        headers = {"Retry-After": str(RETRY_AFTER_S)} if isinstance(exc, OverloadedError) else None
        return fish_error(wire.http_status, refusal_message(exc), headers)
    rate_hz = req.sample_rate_hz or engine.sample_rate
    audio = encoded_audio(stream, ticket, state, req.text, req.format, rate_hz, req.bit_rate_bps)
    return StreamingResponse(
        audio, media_type=content_type(req.format), headers={"X-Accel-Buffering": "no"}
    )


async def _body(request: Request, limit: int) -> bytes:
    """The request body, read no further than ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)
