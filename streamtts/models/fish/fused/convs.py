"""Whether the bf16 vocoder's convolutions can run ``streamtts_fused::row_conv``
(``csrc/row_conv.cpp``; the layout and its use: :mod:`streamtts.models.fish.codec.blocks`).

On the 2-core Zen 4 (2026-12-07) oneDNN's packed bf16 kernel computed a first chunk's
convolutions at 40-300 GFLOP/s, 100-750 µs a call; the first frame of a stream spent ~20 ms of
its ~28 ms through the vocoder in them. ``row_conv`` takes them where the CPU has AVX512-BF16.
"""

from __future__ import annotations

import torch

from streamtts.models.fish.fused.library import FusedUnavailable, load_library


def why_not_row_convs() -> str | None:
    """Why ``row_conv`` cannot be used here (None: it can): the library and AVX512-BF16."""
    try:
        load_library()
    except FusedUnavailable as exc:
        return str(exc)
    if not torch.ops.streamtts_fused.row_conv_supported():
        return "this CPU has no AVX512-BF16"
    return None
