"""Building and loading the fused ops' library: kept under a key, and never half-written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamtts.models.fish.fused import library
from streamtts.models.fish.fused.library import FusedUnavailable


def test_the_library_is_kept_under_a_key_of_its_sources_flags_and_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    first = library.library_path()
    assert first.parent.parent == tmp_path and first.name == "streamtts_fused.so"
    flags = library.BUILD_FLAGS
    monkeypatch.setattr(library, "BUILD_FLAGS", ("-O3",))
    assert library.library_path() != first
    monkeypatch.setattr(library, "BUILD_FLAGS", flags)
    assert library.library_path() == first
    header = tmp_path / "packed_ops.h"
    header.write_text(library.HEADERS[0].read_text() + "// changed\n")
    with monkeypatch.context() as changed:
        changed.setattr(library, "HEADERS", (header,))
        assert library.library_path() != first
    assert library.library_path() == first
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert library.library_path() != first


def test_a_library_that_cannot_be_built_is_unavailable_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source the compiler rejects (as a missing compiler or ninja would fail): a clear
    reason, and nothing half-written where a later start would load it."""
    broken = tmp_path / "slow_step.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(library, "SOURCES", (library.SOURCES[0], broken))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    kept = library.library_path()
    assert kept.is_relative_to(tmp_path / "extensions")
    with pytest.raises(FusedUnavailable, match="building streamtts_fused failed"):
        library.load_library.__wrapped__()
    assert not kept.exists()
