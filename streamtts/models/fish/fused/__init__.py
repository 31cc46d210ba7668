"""The decode step's two halves as C++ ops over packed layers, bit-identical to the Python ones.

On the CPU a decode step is thousands of small kernels, and Python runs between every two of
them; the ops (``csrc/``) make the same ATen calls in the same order, so every result bit stays
the Python code's, without the interpreter in between:

- :class:`~.codebook_pass.FusedCodebookPass` for :func:`fast_codes` (the 7 codebooks of a frame);
- :class:`~.slow_step.FusedSlowStep` for :meth:`DualARTransformer.decode_slow`, and its
  ``prefill`` for :meth:`DualARTransformer.prefill` (the slow transformer over a prompt).

:func:`fused_decode_for` picks them where they apply and the library builds
(:mod:`~.library`), and says what runs and why for the engine's description.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from streamtts.models.fish.fused.codebook_pass import FusedCodebookPass
from streamtts.models.fish.fused.library import FusedUnavailable, load_library
from streamtts.models.fish.fused.slow_step import FusedSlowStep
from streamtts.models.fish.llm.generate import (
    FastCodes,
    Prefill,
    SlowStep,
    fast_codes,
    slow_prefill,
    slow_step,
)
from streamtts.models.fish.llm.llama import DualARTransformer

log = logging.getLogger(__name__)

FUSED = "fused"
PYTHON = "python"


@dataclass(frozen=True)
class DecodeOps:
    """The two halves of a decode step, and what runs each: ``"fused"``, or ``"python"`` with
    the reason. ``prefill`` (the slow transformer over a prompt) runs as ``slow_step`` says."""

    fast: FastCodes
    slow: SlowStep
    prefill: Prefill
    codebook_pass: str
    slow_step: str


PYTHON_OPS = DecodeOps(fast_codes, slow_step, slow_prefill, PYTHON, PYTHON)


def fused_decode_for(model: DualARTransformer, enabled: bool) -> DecodeOps:
    """The fused ops for ``model`` where they apply and (with ``enabled``) the library loads;
    the Python code, with the reason, for each half where not."""
    if not enabled:
        off = f"{PYTHON} (fused_ops is off)"
        return DecodeOps(fast_codes, slow_step, slow_prefill, off, off)
    fast: FastCodes = fast_codes
    slow: SlowStep = slow_step
    prefill: Prefill = slow_prefill
    try:
        fast, fast_what = FusedCodebookPass(model), FUSED
    except FusedUnavailable as exc:
        fast_what = f"{PYTHON} ({exc})"
    try:
        fused_slow = FusedSlowStep(model)
        slow, prefill, slow_what = fused_slow, fused_slow.prefill, FUSED
    except FusedUnavailable as exc:
        slow_what = f"{PYTHON} ({exc})"
    if FUSED in (fast_what, slow_what):
        try:
            load_library()
        except FusedUnavailable as exc:
            log.warning("the fused decode ops are unavailable, the Python code runs: %s", exc)
            unavailable = f"{PYTHON} ({exc})"
            if fast_what == FUSED:
                fast, fast_what = fast_codes, unavailable
            if slow_what == FUSED:
                slow, prefill, slow_what = slow_step, slow_prefill, unavailable
    return DecodeOps(fast, slow, prefill, fast_what, slow_what)
