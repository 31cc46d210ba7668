"""The voice library on disk: one folder per voice, written atomically, shared by replicas.

Layout: ``<voices_dir>/<id>/voice.json`` (metadata: transcript, name, which engine, model and
codec made the codes, duration, creation time), ``codes.npy`` (the reference codes,
``[codebooks, frames]`` int32) and ``reference.<ext>`` (the original upload, as sent).

A voice is written into a hidden ``.incoming-*`` folder and renamed into place in one step, so a
crash mid-upload leaves no half voice (only a hidden folder, removed at the next scan once it is
old) and two uploads of one id cannot both win: the rename of the second fails. A delete renames
the folder away first, then removes it. A damaged voice is logged and skipped, never fatal.
Several servers may share the folder (a shared volume): each rescans it (see the catalog).
Torch-free, blocking file I/O: call it from a thread.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

VOICE_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
META_FILE = "voice.json"
CODES_FILE = "codes.npy"
REFERENCE_STEM = "reference"
INCOMING_PREFIX = ".incoming-"
DELETED_PREFIX = ".deleted-"
STALE_INCOMING_S = 3600.0  # an unfinished upload older than this is debris


class VoiceExistsError(Exception):
    pass


class VoiceNotFoundError(Exception):
    pass


@dataclass(frozen=True)
class StoredVoice:
    id: str
    name: str
    engine: str
    model: str
    codec_id: str
    text: str
    duration_s: float
    created_at: str  # ISO 8601, UTC
    reference_file: str
    codes: npt.NDArray[np.int32]  # [codebooks, frames]

    def public(self) -> dict[str, Any]:
        """The voice as the API shows it."""
        return {
            "id": self.id,
            "name": self.name,
            "engine": self.engine,
            "model": self.model,
            "language": "multi",
            "description": f"cloned from {self.duration_s:.1f} s of reference audio",
            "cloned": True,
            "duration_s": round(self.duration_s, 2),
            "created_at": self.created_at,
            "text": self.text,
            "frames": int(self.codes.shape[1]),
        }


class VoiceStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._seen: dict[str, tuple[int, int, StoredVoice]] = {}  # id -> (inode, mtime, voice)
        self._damaged: set[tuple[str, int]] = set()  # (id, mtime) already logged

    def scan(self) -> dict[str, StoredVoice]:
        """Every intact voice, by id (re-reading only what changed since the last scan)."""
        if not self.directory.is_dir():
            return {}
        found: dict[str, StoredVoice] = {}
        for entry in os.scandir(self.directory):
            if entry.name.startswith(INCOMING_PREFIX):
                self._clear_if_stale(Path(entry.path))
                continue
            if entry.name.startswith(DELETED_PREFIX):  # a delete that did not finish
                shutil.rmtree(entry.path, ignore_errors=True)
                continue
            if not entry.is_dir() or not VOICE_ID.fullmatch(entry.name):
                continue
            voice = self._read(Path(entry.path))
            if voice is not None:
                found[voice.id] = voice
        self._seen = {k: v for k, v in self._seen.items() if k in found}
        return found

    def _read(self, folder: Path) -> StoredVoice | None:
        meta_path = folder / META_FILE
        try:
            info = meta_path.stat()
        except OSError:
            self._damaged_voice(folder.name, 0, "no voice.json")
            return None
        seen = self._seen.get(folder.name)
        if seen is not None and seen[:2] == (info.st_ino, info.st_mtime_ns):
            return seen[2]
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            codes = np.load(folder / CODES_FILE, allow_pickle=False)
            voice = StoredVoice(
                id=folder.name,
                name=str(meta["name"]),
                engine=str(meta["engine"]),
                model=str(meta["model"]),
                codec_id=str(meta["codec_id"]),
                text=str(meta["text"]),
                duration_s=float(meta["duration_s"]),
                created_at=str(meta["created_at"]),
                reference_file=str(meta["reference_file"]),
                codes=codes,
            )
            if meta["id"] != folder.name or codes.ndim != 2 or codes.dtype != np.int32:
                raise ValueError("the codes or the id do not match the folder")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._damaged_voice(folder.name, info.st_mtime_ns, str(exc))
            return None
        self._seen[folder.name] = (info.st_ino, info.st_mtime_ns, voice)
        return voice

    def _damaged_voice(self, voice_id: str, mtime_ns: int, why: str) -> None:
        if (voice_id, mtime_ns) not in self._damaged:
            self._damaged.add((voice_id, mtime_ns))
            log.warning("skipping the damaged voice %r in %s: %s", voice_id, self.directory, why)

    def _clear_if_stale(self, folder: Path) -> None:
        with contextlib.suppress(OSError):
            if time.time() - folder.stat().st_mtime > STALE_INCOMING_S:
                shutil.rmtree(folder, ignore_errors=True)

    def exists(self, voice_id: str) -> bool:
        return (self.directory / voice_id).exists()

    def count(self) -> int:
        return len(self.scan())

    def save(
        self,
        voice: StoredVoice,
        reference: bytes,
        reference_ext: str,
    ) -> StoredVoice:
        """Write ``voice`` (whose ``reference_file`` is ignored) atomically; raises
        :class:`VoiceExistsError` when its id is taken, even by a concurrent upload."""
        self.directory.mkdir(parents=True, exist_ok=True)
        reference_file = f"{REFERENCE_STEM}.{reference_ext}" if reference_ext else REFERENCE_STEM
        incoming = self.directory / f"{INCOMING_PREFIX}{uuid.uuid4().hex}"
        incoming.mkdir()
        try:
            _write(incoming / reference_file, reference)
            with (incoming / CODES_FILE).open("wb") as f:
                np.save(f, np.ascontiguousarray(voice.codes, dtype=np.int32), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            meta = {
                "id": voice.id,
                "name": voice.name,
                "engine": voice.engine,
                "model": voice.model,
                "codec_id": voice.codec_id,
                "text": voice.text,
                "duration_s": voice.duration_s,
                "created_at": voice.created_at,
                "reference_file": reference_file,
                "codes_shape": list(voice.codes.shape),
            }
            _write(incoming / META_FILE, json.dumps(meta, indent=2).encode())
            try:
                os.rename(incoming, self.directory / voice.id)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise VoiceExistsError(voice.id) from None
                raise
        finally:
            shutil.rmtree(incoming, ignore_errors=True)  # nothing left once renamed
        _fsync_dir(self.directory)
        stored = self._read(self.directory / voice.id)
        assert stored is not None
        return stored

    def delete(self, voice_id: str) -> None:
        """Remove a voice; raises :class:`VoiceNotFoundError` when there is none."""
        if not VOICE_ID.fullmatch(voice_id):
            raise VoiceNotFoundError(voice_id)
        doomed = self.directory / f"{DELETED_PREFIX}{uuid.uuid4().hex}"
        try:
            os.rename(self.directory / voice_id, doomed)
        except FileNotFoundError:
            raise VoiceNotFoundError(voice_id) from None
        shutil.rmtree(doomed, ignore_errors=True)
        self._seen.pop(voice_id, None)


def _write(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
