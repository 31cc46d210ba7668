"""Fixtures of the fused ops' tests."""

from __future__ import annotations

import pytest

from streamtts.models.fish.fused.library import FusedUnavailable, load_library


@pytest.fixture(scope="module")
def fused_library() -> None:
    """The fused ops' library loaded (built at first use), or the module's tests skipped."""
    try:
        load_library()
    except FusedUnavailable as exc:
        pytest.skip(str(exc))
