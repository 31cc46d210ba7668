"""``/v1/voices``: list, read, add (a reference recording and its transcript) and delete voices.

``POST /v1/voices`` takes ``multipart/form-data``: ``audio`` (a file), ``text`` (its
transcript), optional ``name`` and ``id``. The body is bounded while it is read
(``max_voice_upload_bytes``) and parsed with Starlette's multipart parser (python-multipart).
Errors are ``{"error": {"code", "message"}}`` with the status docs/protocol.md lists; a refused
request changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from python_multipart.exceptions import MultipartParseError
from starlette.datastructures import UploadFile
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from streamtts.server.state import AppState
from streamtts.voices.catalog import VoiceError, VoiceUpload

FIELDS = ("audio", "text", "name", "id")


def voice_error(code: str, status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


async def list_voices(request: Request, state: AppState) -> Response:
    await state.voices.refresh_on_miss(None)
    return JSONResponse({"voices": state.voices.listing(), "default": state.engine.default_voice})


async def get_voice(request: Request, state: AppState) -> Response:
    voice_id = request.path_params["voice_id"]
    await state.voices.refresh_on_miss(voice_id)
    voice = state.voices.get(voice_id)
    if voice is None:
        return voice_error("voice_not_found", 404, f"no voice {voice_id!r}")
    return JSONResponse(voice)


async def delete_voice(request: Request, state: AppState) -> Response:
    try:
        await state.voices.delete(request.path_params["voice_id"])
    except VoiceError as exc:
        return voice_error(exc.code, exc.status, exc.message)
    return Response(status_code=204)


async def add_voice(request: Request, state: AppState) -> Response:
    if not state.engine.supports_cloning:  # before reading an upload that cannot be used
        kind = state.engine.kind
        return voice_error("cloning_not_supported", 400, f"the {kind} engine cannot clone voices")
    try:
        upload = await _read_upload(request, state.settings.voices.max_voice_upload_bytes)
        created = await state.voices.create(upload)
    except VoiceError as exc:
        return voice_error(exc.code, exc.status, exc.message)
    return JSONResponse(created, status_code=201)


class _TooLarge(Exception):
    pass


async def _read_upload(request: Request, limit_bytes: int) -> VoiceUpload:
    content_type = request.headers.get("content-type", "")
    multipart = content_type.startswith("multipart/form-data")
    if not multipart and not content_type.startswith("application/x-www-form-urlencoded"):
        raise VoiceError("invalid_form", 400, "send multipart/form-data (audio, text, name, id)")
    too_large = VoiceError(
        "upload_too_large", 413, f"the upload is over {limit_bytes} bytes (max_voice_upload_bytes)"
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise too_large

    async def bounded() -> AsyncGenerator[bytes, None]:
        read = 0
        async for chunk in request.stream():
            read += len(chunk)
            if read > limit_bytes:
                raise _TooLarge
            yield chunk

    # A urlencoded form cannot carry a file: it is read (to say what is missing) but no audio.
    parser = (
        MultiPartParser(request.headers, bounded(), max_files=1, max_fields=len(FIELDS))
        if multipart
        else FormParser(request.headers, bounded())
    )
    try:
        form = await parser.parse()
    except _TooLarge:
        raise too_large from None
    except (MultiPartException, MultipartParseError) as exc:
        raise VoiceError("invalid_form", 400, f"the form could not be read: {exc}") from None
    try:
        unknown = sorted(set(form.keys()) - set(FIELDS))
        if unknown:
            raise VoiceError("invalid_form", 400, f"unknown field {unknown[0]!r}; send {FIELDS}")
        audio = form.get("audio")
        data = b""
        filename = ""
        if isinstance(audio, UploadFile):
            data = await audio.read()
            filename = audio.filename or ""
        elif isinstance(audio, str):
            raise VoiceError("missing_audio", 400, "'audio' must be a file, not a text field")
        texts = {name: form.get(name) for name in ("text", "name", "id")}
        for field, value in texts.items():
            if value is not None and not isinstance(value, str):
                raise VoiceError("invalid_form", 400, f"'{field}' must be a text field")
        return VoiceUpload(
            audio=data,
            filename=filename,
            text=str(texts["text"] or ""),
            name=str(texts["name"] or ""),
            voice_id=str(texts["id"] or ""),
        )
    finally:
        await form.close()
