"""A Piper voice's calibration kept between starts.

Calibration (:func:`streamtts.piper.stages.calibrate`, and the check that the blocked decoder
makes the exported one's audio) makes a dozen sentences at load: about 3 s of a ~7.5 s start
with the bundled voice on the 2-core dev machine. What it finds depends only on the voice's
files, the code that cuts and rewrites its graph, the libraries that run it and the CPU's
kernels, so it is stored under a key made of all of them (:func:`calibration_key`) and read
back at the next start. A start from a stored calibration still checks it on this machine:
one sentence made whole and as a first window and the rest must match
(:meth:`streamtts.piper.stages.StagedVoice.holds`); an entry that does not hold, cannot be read
or is not ours is calibrated again and replaced. The cache is only ever a shortcut: a folder
that cannot be written is logged once per voice and the voice is calibrated as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

OFF = "off"
# Bumped when what an entry holds changes meaning; part of every key.
FORMAT_VERSION = 1
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

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT_VERSION, **dataclasses.asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        """The entry ``text`` holds; ValueError for anything else (another format, a field
        missing, extra or of the wrong type, a gain that is not a positive finite number)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.pop("format", None) != FORMAT_VERSION:
            raise ValueError("not a calibration of this format")
        names = {f.name for f in dataclasses.fields(cls)}
        if set(data) != names:
            raise ValueError(f"fields {sorted(data)}, not {sorted(names)}")
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


def calibration_key(model: Path, config: Path, onnx_threads: int, blocked: bool) -> str:
    """A digest of everything calibration depends on: the voice's model and config, how its
    sessions run, this package's Piper code, the libraries' versions and the CPU."""
    digest = hashlib.sha256(f"streamtts-piper-calibration {FORMAT_VERSION}\n".encode())
    for path in (model, config):
        _hash_file(digest, path)
    digest.update(f"onnx_threads={onnx_threads} blocked={blocked}\n".encode())
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
    """Entries ``<key>.json`` in ``directory`` (made when the first one is stored)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> Calibration | None:
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
            return Calibration.from_json(text)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            log.warning("Piper calibration cache: %s is not usable (%s); calibrating", path, exc)
            return None

    def store(self, key: str, calibration: Calibration) -> None:
        """Write the entry atomically (a reader never sees half of one); a folder that cannot
        be written is logged, never raised: the next start calibrates again."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, partial = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".partial")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(calibration.to_json())
                os.replace(partial, self._path(key))
            except BaseException:
                Path(partial).unlink(missing_ok=True)
                raise
        except OSError as exc:
            log.warning(
                "Piper calibration cache: cannot write to %s (%s); the next start calibrates again",
                self.directory,
                exc,
            )
