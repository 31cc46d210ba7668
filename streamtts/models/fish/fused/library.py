"""Building and loading the fused decode ops' library (``csrc/``).

The library is compiled from its sources at first use (``torch.utils.cpp_extension``: a C++
compiler and ninja, about 20-40 s once on the 2-core dev CPU; ninja from the ``PATH``, else
the one the ``fish`` extra installs beside this interpreter) into
``<TORCH_EXTENSIONS_DIR>/streamtts_fused-<key>`` (``$XDG_CACHE_HOME/torch_extensions`` by
default), the key naming the sources, the flags and torch's version; a later start, or another
process, loads it from there with no compiler. Where it cannot be built, the caller gets
:class:`FusedUnavailable` with the reason.

Every change of sources, flags or torch makes a new key, so a start marks the library it loads
as used (its file's time), and a build removes the libraries of other keys that no start has
used for :data:`UNUSED_FOR_S` (another version's, say, on a cache volume several pods share)
and the folders of builds abandoned for :data:`ABANDONED_AFTER_S`: the folder stays bounded
across upgrades.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sysconfig
import time
import types
from collections.abc import Iterator
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = (
    CSRC / "codebook_pass.cpp",
    CSRC / "slow_step.cpp",
    CSRC / "row_linear.cpp",
    CSRC / "top_p.cpp",
    CSRC / "sample.cpp",
    CSRC / "attention.cpp",
    CSRC / "row_ops.cpp",
    CSRC / "row_conv.cpp",
)
HEADERS = (
    CSRC / "packed_ops.h",
    CSRC / "bf16x16.h",
    CSRC / "ranks.h",
    CSRC / "nucleus.h",
    CSRC / "row_tiles.h",
    CSRC / "product_team.h",
)
LIBRARY_NAME = "streamtts_fused"
# No -march=native: a library built once may be loaded on another x86-64 host (a shared cache
# volume); row_linear's AVX512-BF16 code is compiled for that target alone and runs only where
# the CPU has it. OpenMP: row_linear's at::parallel_for runs on torch's own threads (its
# libgomp, by soname), so torch.set_num_threads sizes it. No contraction of a product and a sum
# into a fused multiply-add, which would round them once where the Python kernels round twice.
BUILD_FLAGS = ("-O2", "-fopenmp", "-ffp-contract=off")
# The Piper calibration cache's policy (streamtts.piper.calibration_cache), stated again: an
# image build runs this file by path, with nothing of the package importable.
UNUSED_FOR_S = 30 * 24 * 3600.0
ABANDONED_AFTER_S = 3600.0  # a build folder no process has written to for this long
BUILD_PREFIX = "build-"


class FusedUnavailable(RuntimeError):
    """A fused op does not apply to this model, or the library cannot be built here."""


def _cpp_extension() -> types.ModuleType:
    # Imported when needed: it imports setuptools, which a server on CUDA never needs.
    try:
        from torch.utils import cpp_extension
    except ImportError as exc:  # no setuptools
        raise FusedUnavailable(f"torch.utils.cpp_extension is unavailable: {exc}") from exc
    return cpp_extension


def library_path() -> Path:
    """Where the library for these sources, these flags and this torch is kept."""
    digest = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    digest.update(" ".join(BUILD_FLAGS).encode())
    digest.update(torch.__version__.encode())
    # torch's own convention for extensions (TORCH_EXTENSIONS_DIR, else the user cache).
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or _cpp_extension().get_default_build_root())
    return root / f"{LIBRARY_NAME}-{digest.hexdigest()[:16]}" / f"{LIBRARY_NAME}.so"


@functools.cache
def load_library() -> None:
    """Load the ops' library, building it first where none is kept (once per process)."""
    library = library_path()
    if library.exists():
        _mark_used(library)
        try:
            torch.ops.load_library(str(library))  # type: ignore[no-untyped-call]
        except OSError as exc:  # e.g. built against another libtorch under the same key
            raise FusedUnavailable(f"loading {library} failed: {exc}") from exc
        return
    # Built in a directory of this process's own, then moved into place in one rename: a
    # process starting meanwhile sees the whole library or none.
    build = library.parent / f"{BUILD_PREFIX}{os.getpid()}"
    log.info("building the fused decode ops (once, ~20-40 s) into %s", library.parent)
    started_s = time.perf_counter()
    try:
        build.mkdir(parents=True, exist_ok=True)
        with _ninja_on_path():
            _cpp_extension().load(
                name=LIBRARY_NAME,
                sources=[str(source) for source in SOURCES],
                extra_cflags=list(BUILD_FLAGS),
                extra_ldflags=["-fopenmp"],
                build_directory=str(build),
                is_python_module=False,
                verbose=False,
            )
    except (OSError, RuntimeError, ImportError) as exc:  # no compiler or ninja: a clear reason
        raise FusedUnavailable(f"building {LIBRARY_NAME} failed: {exc}") from exc
    os.replace(build / f"{LIBRARY_NAME}.so", library)
    shutil.rmtree(build, ignore_errors=True)
    log.info("built the fused decode ops in %.1f s", time.perf_counter() - started_s)
    remove_stale(library)


def build_search_path(path: str, scripts: str) -> str:
    """The ``PATH`` a build runs with: ``path``, and after it ``scripts`` (this interpreter's
    scripts folder) where that holds ninja and ``path`` does not. PyPI's ``ninja``, which the
    ``fish`` extra installs, puts it there, where a virtual environment that was not activated
    (``.venv/bin/streamtts serve``) has it off the ``PATH``."""
    if shutil.which("ninja", path=path) is not None or shutil.which("ninja", path=scripts) is None:
        return path
    return os.pathsep.join(folder for folder in (path, scripts) if folder)


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch runs ninja from the ``PATH``: the build's, for its duration."""
    saved = os.environ.get("PATH")
    os.environ["PATH"] = build_search_path(saved or os.defpath, sysconfig.get_path("scripts"))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved


def _mark_used(library: Path) -> None:
    """Set the library's file time to now: it was used (a read-only folder: left as it is)."""
    with contextlib.suppress(OSError):
        os.utime(library)


def remove_stale(kept: Path) -> list[Path]:
    """Beside the library ``kept``, remove the libraries of other keys unused for
    :data:`UNUSED_FOR_S` and build folders abandoned for :data:`ABANDONED_AFTER_S` (a key's
    folder with nothing left goes too); what was removed. Another process removing the same
    at once is no error."""
    now_s = time.time()
    removed: list[Path] = []
    for folder in sorted(kept.parent.parent.glob(f"{LIBRARY_NAME}-*")):
        if not folder.is_dir():
            continue
        library = folder / kept.name
        if folder != kept.parent and _older_than(library, UNUSED_FOR_S, now_s):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            continue
        for build in folder.glob(f"{BUILD_PREFIX}*"):
            if _older_than(build, ABANDONED_AFTER_S, now_s):
                shutil.rmtree(build, ignore_errors=True)
                removed.append(build)
        if folder != kept.parent and not library.exists():
            with contextlib.suppress(OSError):
                folder.rmdir()  # only where empty
                removed.append(folder)
    if removed:
        log.info("removed %d stale builds of the fused decode ops", len(removed))
    return removed


def _older_than(path: Path, age_s: float, now_s: float) -> bool:
    try:
        return now_s - path.stat().st_mtime > age_s
    except OSError:  # gone meanwhile, or never made
        return False


if __name__ == "__main__":
    # An image build runs this file by path (no package import, so no dependency but torch):
    # it builds the library where TORCH_EXTENSIONS_DIR says, for an image without a compiler.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    load_library()
    print(library_path())
