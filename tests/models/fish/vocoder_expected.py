"""Reading the vocoder's expected outputs from the Fish fixture set (checked against index.json)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

GENERATOR = "firefly-gan-vq-fsq-8x1024-21hz-generator.pth"


def expected(fixture_dir: Path, index: dict[str, Any], name: str) -> npt.NDArray[Any]:
    """``expected/<name>``, asserting the dtype and shape that index.json declares."""
    meta = index["files"][name]
    array: npt.NDArray[Any] = np.load(fixture_dir / "expected" / name)
    assert str(array.dtype) == meta["dtype"], name
    assert list(array.shape) == meta["shape"], name
    return array


def decode_source(index: dict[str, Any], name: str) -> tuple[str, slice]:
    """Which codes file (and which frame slice of it) upstream decoded to produce ``name``.

    Parsed from the recorded upstream call, e.g. ``v.decode(indices=dec_codes[None,:, 0:17], …``.
    """
    call = index["files"][name]["call"]
    if name.startswith("dec_audio"):
        sliced = re.search(r"dec_codes\[None,\s*:,\s*(\d+):(\d+)\]", call)
        if sliced:
            return "dec_codes.npy", slice(int(sliced[1]), int(sliced[2]))
        assert "indices=dec_codes[None]" in call, call
        return "dec_codes.npy", slice(None)
    match = re.search(r"indices=(\w+)\[None\]", call)
    assert match, call
    return f"{match[1]}.npy", slice(None)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with ``n`` intra-op threads. The tiny fixture model's ops are too small to gain from
    threads, and on a shared CPU OpenMP spin-waiting makes 2 threads several times slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
