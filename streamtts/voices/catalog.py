"""The voices a server offers, and the one place every interface resolves a voice id.

A voice is the engine's own (``default`` names the model's default voice; Piper also finds
models in the voices folder) or a stored cloned voice (a reference recording and its
transcript, encoded once to codes, see :mod:`streamtts.voices.store`). A stored voice is offered
only by an engine that clones and only if this engine's codec made its codes (a voice made for
another checkpoint is skipped, with a log line, not silently used).

Replicas sharing one voices folder see each other's changes: the catalog rescans the folder
every ``voices_rescan_s`` and at once when asked for an id it does not know (such rescans at
most every :data:`MISS_RESCAN_S`, so unknown ids cannot make it scan without pause).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any

from streamtts.engine.base import (
    ClonedVoice,
    CloningNotSupportedError,
    Codes,
    Engine,
    EngineError,
    UnknownVoiceError,
    VoiceInfo,
)
from streamtts.voices.audio_input import AudioInputError, DecodedAudio, decode_reference
from streamtts.voices.settings import VoiceSettings
from streamtts.voices.store import (
    VOICE_ID,
    StoredVoice,
    VoiceExistsError,
    VoiceNotFoundError,
    VoiceStore,
)

log = logging.getLogger(__name__)

DEFAULT_VOICE_ALIAS = "default"
INLINE_VOICE_ID = "inline"  # names a one-off voice (its prompt is cached by content)
MISS_RESCAN_S = 0.2  # unknown ids rescan the folder at most this often
MAX_NAME_CHARS = 100
MAX_TEXT_CHARS = 2000


class VoiceError(Exception):
    """A refused voice request: ``code`` and HTTP ``status`` as docs/protocol.md lists them."""

    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


@dataclass(frozen=True)
class VoiceUpload:
    audio: bytes
    filename: str
    text: str
    name: str = ""
    voice_id: str = ""


class VoiceCatalog:
    def __init__(self, engine: Engine, settings: VoiceSettings) -> None:
        self._engine = engine
        self._settings = settings
        self._store = VoiceStore(settings.library_dir())
        self._stored: dict[str, StoredVoice] = {}
        self._last_miss_scan_s = float("-inf")
        self._lock = asyncio.Lock()

    @property
    def directory(self) -> PurePath:
        return self._store.directory

    # ---- looking voices up (no I/O) ----

    def _builtin_ids(self) -> set[str]:
        return {v.id for v in self._engine.voices()}

    def __contains__(self, voice_id: object) -> bool:
        return isinstance(voice_id, str) and (
            voice_id == DEFAULT_VOICE_ALIAS
            or voice_id in self._builtin_ids()
            or voice_id in self._stored
        )

    def resolve(self, voice_id: str) -> str | ClonedVoice:
        """What to hand the engine for ``voice_id``; :class:`UnknownVoiceError` if none."""
        if voice_id == DEFAULT_VOICE_ALIAS:
            return self._engine.default_voice
        if voice_id in self._builtin_ids():
            return voice_id
        stored = self._stored.get(voice_id)
        if stored is None:
            raise UnknownVoiceError(f"unknown voice {voice_id!r}; GET /v1/voices lists them")
        return ClonedVoice(stored.id, stored.text, stored.codes)

    def infos(self) -> list[VoiceInfo]:
        """Every voice offered (built-in first), for interfaces that list voices themselves
        (Wyoming's describe)."""
        stored = sorted(self._stored.values(), key=lambda v: v.id)
        return self._engine.voices() + [
            VoiceInfo(v.id, v.name, "multi", v.engine, str(v.public()["description"]))
            for v in stored
        ]

    def listing(self) -> list[dict[str, Any]]:
        builtin = [{**vars(v), "cloned": False} for v in self._engine.voices()]
        return builtin + [v.public() for v in sorted(self._stored.values(), key=lambda v: v.id)]

    def get(self, voice_id: str) -> dict[str, Any] | None:
        return next((v for v in self.listing() if v["id"] == voice_id), None)

    # ---- keeping up with the folder ----

    async def refresh(self) -> None:
        """Rescan the folder (and the engine's own voices)."""
        async with self._lock:
            found = await asyncio.to_thread(self._store.scan)
            usable = {k: v for k, v in found.items() if self._usable(v)}
            for voice_id, old in self._stored.items():
                new = usable.get(voice_id)
                if new is None or new.codes is not old.codes:
                    self._engine.forget_voice(voice_id)  # deleted or replaced elsewhere
            self._stored = usable
            await self._engine.refresh_voices()

    def _usable(self, voice: StoredVoice) -> bool:
        if not self._engine.supports_cloning:
            return False
        codec = self._engine.codec_id()
        if voice.codec_id != codec or voice.id in self._builtin_ids():
            log.info(
                "voice %r in %s was made by codec %s; this server runs %s: not offered",
                voice.id,
                self._store.directory,
                voice.codec_id,
                codec,
            )
            return False
        return True

    async def refresh_on_miss(self, voice_id: object) -> None:
        """Rescan now if ``voice_id`` is unknown (another replica may have just added it)."""
        if voice_id in self or not isinstance(voice_id, str):
            return
        now_s = time.monotonic()
        if now_s - self._last_miss_scan_s >= MISS_RESCAN_S:
            self._last_miss_scan_s = now_s
            await self.refresh()

    async def run_rescans(self) -> None:
        """Rescan every ``voices_rescan_s`` until cancelled (the app's lifespan runs it)."""
        while True:
            await asyncio.sleep(self._settings.voices_rescan_s)
            try:
                await self.refresh()
            except Exception:  # a passing disk problem must not end the rescans
                log.exception("rescanning the voices in %s failed", self._store.directory)

    # ---- adding and deleting ----

    async def one_off(self, audio: bytes, text: str) -> ClonedVoice:
        """A voice made of an inline reference (Fish API ``references``) for one request: encoded
        now, not stored; its prompt is cached by content like a stored voice's. Refused as
        :meth:`create` refuses."""
        text = self._check_reference(audio, text)
        decoded = await self._decode(audio)
        return ClonedVoice(INLINE_VOICE_ID, text, await self._encode(decoded))

    def _check_reference(self, audio: bytes, text: str) -> str:
        """The transcript, normalised; :class:`VoiceError` if the engine cannot clone or the
        reference is missing a part."""
        engine = self._engine
        if not engine.supports_cloning:
            raise VoiceError(
                "cloning_not_supported",
                400,
                f"the {engine.kind} engine cannot clone voices; serve a Fish-Speech model",
            )
        if not audio:
            raise VoiceError("missing_audio", 400, "send the reference recording as 'audio'")
        text = " ".join(text.split())
        if not text:
            raise VoiceError("missing_text", 400, "send the recording's transcript as 'text'")
        if len(text) > MAX_TEXT_CHARS:
            raise VoiceError("text_too_long", 400, f"'text' is over {MAX_TEXT_CHARS} characters")
        return text

    async def _decode(self, audio: bytes) -> DecodedAudio:
        settings = self._settings
        try:
            return await asyncio.to_thread(
                decode_reference, audio, settings.min_reference_s, settings.max_reference_s
            )
        except AudioInputError as exc:
            status = 415 if exc.code == "unsupported_audio" else 400
            raise VoiceError(exc.code, status, str(exc)) from None

    async def _encode(self, decoded: DecodedAudio) -> Codes:
        try:
            return await self._engine.encode_reference(decoded.samples, decoded.rate_hz)
        except CloningNotSupportedError as exc:
            raise VoiceError("cloning_not_supported", 400, str(exc)) from None
        except EngineError as exc:
            raise VoiceError("unsupported_audio", 400, str(exc)) from None

    async def create(self, upload: VoiceUpload) -> dict[str, Any]:
        """Encode and store a cloned voice; :class:`VoiceError` if refused (nothing changes)."""
        engine, settings = self._engine, self._settings
        text = self._check_reference(upload.audio, upload.text)
        name = " ".join(upload.name.split())[:MAX_NAME_CHARS]
        voice_id = upload.voice_id or _new_id(name or PurePath(upload.filename).stem)
        self._check_new_id(voice_id)
        await self.refresh()
        if voice_id in self._stored or await asyncio.to_thread(self._store.exists, voice_id):
            raise VoiceError("voice_exists", 409, f"a voice {voice_id!r} exists already")
        if len(self._stored) >= settings.max_voices:
            raise VoiceError(
                "too_many_voices", 409, f"the library holds its limit of {settings.max_voices}"
            )
        decoded = await self._decode(upload.audio)
        codes = await self._encode(decoded)
        voice = StoredVoice(
            id=voice_id,
            name=name or voice_id,
            engine=engine.kind,
            model=str(engine.describe().get("model", "")),
            codec_id=engine.codec_id() or "",
            text=text,
            duration_s=decoded.duration_s,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            reference_file="",
            codes=codes,
        )
        try:
            stored = await asyncio.to_thread(
                self._store.save, voice, upload.audio, _extension(upload.filename, decoded.format)
            )
        except VoiceExistsError:
            raise VoiceError("voice_exists", 409, f"a voice {voice_id!r} exists already") from None
        self._stored[stored.id] = stored
        log.info("voice %r added (%.1f s, %d frames)", stored.id, voice.duration_s, codes.shape[1])
        return stored.public()

    def _check_new_id(self, voice_id: str) -> None:
        if not VOICE_ID.fullmatch(voice_id):
            raise VoiceError(
                "invalid_voice_id",
                400,
                "a voice id is 1-64 characters of a-z, 0-9, '_' and '-', starting with a letter "
                "or digit",
            )
        if voice_id == DEFAULT_VOICE_ALIAS or voice_id in self._builtin_ids():
            raise VoiceError("reserved_voice_id", 400, f"{voice_id!r} names a built-in voice")

    async def delete(self, voice_id: str) -> None:
        if voice_id == DEFAULT_VOICE_ALIAS or voice_id in self._builtin_ids():
            raise VoiceError("builtin_voice", 400, f"{voice_id!r} is built in; it cannot go")
        try:
            await asyncio.to_thread(self._store.delete, voice_id)
        except VoiceNotFoundError:
            raise VoiceError("voice_not_found", 404, f"no voice {voice_id!r}") from None
        self._stored.pop(voice_id, None)
        self._engine.forget_voice(voice_id)
        log.info("voice %r deleted", voice_id)


def _new_id(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:48].strip("-")
    return f"{slug or 'voice'}-{secrets.token_hex(3)}"


def _extension(filename: str, container: str) -> str:
    suffix = PurePath(filename).suffix.lower().lstrip(".")
    if re.fullmatch(r"[a-z0-9]{1,8}", suffix):
        return suffix
    return container if re.fullmatch(r"[a-z0-9]{1,8}", container) else "bin"
