"""A Piper voice's calibration kept between starts.

Calibration (:func:`streamtts.piper.stages.calibrate`, and the check that the blocked decoder
makes the exported one's audio) makes a dozen sentences at load; with reading, cutting and
rewriting the voice's graph, about 4 s of a ~7.5 s start with the bundled voice on the 2-core
dev machine. What it finds depends only on the voice's
files, the code that cuts and rewrites its graph, the libraries that run it and the CPU's
kernels, so it is stored under a key made of all of them (:func:`calibration_key`) and read
back at the next start. A start from a stored calibration still checks it on this machine:
one sentence made whole and as a first window and the rest must match
(:meth:`streamtts.piper.stages.StagedVoice.holds`); an entry that does not hold, cannot be read
or is not ours is calibrated again and replaced. The cache is only ever a shortcut: a folder
that cannot be written is logged once per voice and the voice is calibrated as before.

An entry also holds the voice's graph as it runs — cut into stages, the flow into its links,
the decoder rewritten (:mod:`streamtts.piper.load`), each as ONNX Runtime optimized it — so a
start from it need not read, cut, rewrite or optimize the graph either (``onnx`` is not even
imported): its sessions load those files.

Every change of code, library or CPU makes a new key; storing an entry removes older ones
(:meth:`CalibrationCache.evict`), so the folder stays bounded across upgrades.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

OFF = "off"
# Bumped when what an entry holds changes meaning; part of every key.
FORMAT_VERSION = 2
# Every key is new once the code, a library or the CPU changes, so older entries are removed
# when one is stored: a voice keeps its most recently used entries (one per code version,
# CPU or thread setting still in use, e.g. nodes of different CPUs sharing the folder), and an
# entry not used for a month goes whatever its voice.
ENTRIES_PER_VOICE = 3
UNUSED_FOR_S = 30 * 24 * 3600.0
# Parts' folders and partial files of no entry are another writer's until this old.
ABANDONED_AFTER_S = 3600.0
# The libraries whose kernels, graph tools or phonemizer shape what calibration finds.
LIBRARIES = ("onnxruntime", "onnx", "piper-tts")
_PIPER_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Calibration:
    """What calibrating a voice found (the fields of :class:`StagedVoice` it sets)."""

    context_frames: int | None  # the decoder's; None: decoded whole only
    flow_context_frames: int | None  # None: the flow runs whole
    flow_chained: bool  # the flow's windows run link by link
    decodes_blocked: bool  # the decoder runs on the blocked kernels
    gain: float

    @classmethod
    def from_dict(cls, data: object) -> Calibration:
        """The calibration ``data`` holds; ValueError for anything else (a field missing, extra
        or of the wrong type, a gain that is not a positive finite number)."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            raise ValueError(f"a calibration has the fields {sorted(names)}")
        for name in ("context_frames", "flow_context_frames"):
            value = data[name]
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"{name} must be a frame count or null, not {value!r}")
        for name in ("flow_chained", "decodes_blocked"):
            if type(data[name]) is not bool:
                raise ValueError(f"{name} must be true or false, not {data[name]!r}")
        gain = data["gain"]
        if type(gain) not in (int, float) or not 0 < gain < float("inf"):
            raise ValueError(f"gain must be a positive number, not {gain!r}")
        return cls(**{**data, "gain": float(gain)})


@dataclass(frozen=True)
class StoredVoice:
    """An entry: the calibration, and (where stored) the voice's graph as it runs: its parts'
    files in ``parts_dir``, described by ``layout`` (the loader's own description)."""

    calibration: Calibration
    layout: dict[str, Any] | None = None
    parts_dir: Path | None = None


def cache_directory(setting: str) -> Path | None:
    """The folder the setting names: ``""`` the user's cache folder
    (``$XDG_CACHE_HOME/streamtts/piper``, else ``~/.cache/streamtts/piper``), ``"off"`` none."""
    if setting == OFF:
        return None
    if setting:
        return Path(setting).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "streamtts" / "piper"


def voice_digest(model: Path, config: Path) -> str:
    """A digest of the voice's files (the same voice wherever its files lie)."""
    digest = hashlib.sha256()
    for path in (model, config):
        _hash_file(digest, path)
    return digest.hexdigest()


def calibration_key(voice: str, onnx_threads: int, blocked: bool) -> str:
    """A digest of everything calibration depends on: the voice (:func:`voice_digest`), how its
    sessions run, this package's Piper code, the libraries' versions and the CPU."""
    digest = hashlib.sha256(f"streamtts-piper-calibration {FORMAT_VERSION}\n".encode())
    digest.update(f"voice={voice} onnx_threads={onnx_threads} blocked={blocked}\n".encode())
    for source in sorted(_PIPER_PACKAGE_DIR.glob("*.py")):
        digest.update(source.name.encode())
        _hash_file(digest, source)
    for library in LIBRARIES:
        digest.update(f"{library}={_version(library)}\n".encode())
    digest.update(_cpu_identity().encode())
    return digest.hexdigest()


def _hash_file(digest: hashlib._Hash, path: Path) -> None:
    with path.open("rb") as f:
        digest.update(hashlib.file_digest(f, "sha256").digest())


def _version(library: str) -> str:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags (which kernels ONNX Runtime picks)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    first = text.split("\n\n", 1)[0]
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in first.splitlines())
    )
    flags = " ".join(sorted(fields.get("flags", fields.get("Features", "")).split()))
    return f"{platform.machine()} {fields.get('model name', platform.processor())} {flags}"


class CalibrationCache:
    """Entries ``<key>.json``, each with its parts' folder ``<key>.<suffix>`` beside it, in
    ``directory`` (made when the first one is stored)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> StoredVoice | None:
        """The stored entry, or None where there is none or it cannot be used (logged)."""
        path = self._path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("Piper calibration cache: cannot read %s (%s); calibrating", path, exc)
            return None
        try:
            entry = self._entry(key, json.loads(text))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            log.warning("Piper calibration cache: %s is not usable (%s); calibrating", path, exc)
            return None
        with contextlib.suppress(OSError):  # a read-only folder: the entry just looks older
            os.utime(path)  # used now: kept before entries used less recently
        return entry

    def _entry(self, key: str, data: object) -> StoredVoice:
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            raise ValueError("not an entry of this format")
        if set(data) != {"format", "voice", "calibration", "layout", "parts"}:
            raise ValueError(f"fields {sorted(data)}")
        calibration = Calibration.from_dict(data["calibration"])
        layout, parts = data["layout"], data["parts"]
        if layout is None and parts is None:
            return StoredVoice(calibration)
        if not isinstance(layout, dict) or not isinstance(parts, str):
            raise ValueError("a layout goes with its parts' folder")
        parts_dir = self.directory / parts
        if parts_dir.parent != self.directory or not parts.startswith(f"{key}."):
            raise ValueError(f"parts folder {parts!r} is not this entry's")
        return StoredVoice(calibration, layout, parts_dir)

    def store(
        self,
        key: str,
        calibration: Calibration,
        layout: dict[str, Any] | None = None,
        parts: Mapping[str, bytes] | None = None,
        *,
        voice: str | None = None,
    ) -> None:
        """Write the entry: its parts' files (``parts``: file name -> bytes, described by
        ``layout``) into a folder of their own, then its JSON, atomically (a reader sees the
        old entry or the new one, whole); older parts of the key are removed, and older
        entries as :meth:`evict` says (``voice``: :func:`voice_digest`; None: an entry only
        age removes). A folder that cannot be written is logged, never raised: the next start
        calibrates again."""
        parts_dir: Path | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if parts is not None:
                parts_dir = Path(tempfile.mkdtemp(dir=self.directory, prefix=f"{key}."))
                for name, content in parts.items():
                    (parts_dir / Path(name).name).write_bytes(content)
            entry = {
                "format": FORMAT_VERSION,
                "voice": voice,
                "calibration": dataclasses.asdict(calibration),
                "layout": layout if parts is not None else None,
                "parts": None if parts_dir is None else parts_dir.name,
            }
            fd, partial = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".partial")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(entry, f, sort_keys=True)
                os.replace(partial, self._path(key))
            except BaseException:
                Path(partial).unlink(missing_ok=True)
                raise
        except OSError as exc:
            if parts_dir is not None:
                shutil.rmtree(parts_dir, ignore_errors=True)
            log.warning(
                "Piper calibration cache: cannot write to %s (%s); the next start calibrates again",
                self.directory,
                exc,
            )
            return
        for older in self.directory.glob(f"{key}.*"):
            if older.is_dir() and older != parts_dir:
                shutil.rmtree(older, ignore_errors=True)
        self.evict(key, voice)

    def evict(self, key: str, voice: str | None) -> None:
        """Remove, but for ``key``'s entry: the entries of ``voice`` beyond the
        ``ENTRIES_PER_VOICE`` - 1 used most recently (a load marks an entry used), every
        entry not used for ``UNUSED_FOR_S`` (one this code cannot read too), and parts'
        folders and partial files of no entry once ``ABANDONED_AFTER_S`` old. Each entry's
        JSON goes before its parts: a start reading it meanwhile calibrates, as without it.
        Never raises (a file another process removed first is gone either way; a folder that
        cannot be listed is logged)."""
        try:
            self._evict(key, voice, time.time())
        except OSError as exc:
            log.warning("Piper calibration cache: cannot clean %s (%s)", self.directory, exc)

    def _evict(self, key: str, voice: str | None, now_s: float) -> None:
        used: dict[str, float] = {}  # key -> when its entry was last used
        of_voice: list[str] = []
        for path in self.directory.glob("*.json"):
            other = path.name.removesuffix(".json")
            if other == key or other.startswith("."):
                continue
            try:
                used[other] = path.stat().st_mtime
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # unreadable: only its age counts
            if voice is not None and isinstance(data, dict) and data.get("voice") == voice:
                of_voice.append(other)
        of_voice.sort(key=lambda k: used[k], reverse=True)
        gone = set(of_voice[ENTRIES_PER_VOICE - 1 :])
        gone |= {k for k, used_s in used.items() if now_s - used_s > UNUSED_FOR_S}
        for other in sorted(gone):
            with contextlib.suppress(OSError):
                self._path(other).unlink()
        kept = ({key} | used.keys()) - gone
        for path in self.directory.iterdir():
            owner = path.name.split(".", 1)[0]
            if path.suffix == ".json" and not path.name.startswith("."):
                continue
            try:
                abandoned = now_s - path.stat().st_mtime > ABANDONED_AFTER_S
            except OSError:
                continue
            if owner in gone or (owner not in kept and abandoned):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        path.unlink()
