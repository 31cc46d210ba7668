"""fused_decode_for: the fused ops where they apply and load, the Python code with the reason
for each half where not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamtts.models.fish import fused
from streamtts.models.fish.fused import FUSED, fused_decode_for, library
from streamtts.models.fish.fused.codebook_pass import FusedCodebookPass
from streamtts.models.fish.fused.slow_step import FusedSlowStep
from streamtts.models.fish.llm.generate import fast_codes, slow_prefill, slow_step
from streamtts.models.fish.llm.llama import fuse_gate_up_
from streamtts.models.fish.packed import PackedLinear, pack_linears_
from tests.models.fish.fused.models import packed, tiny


def test_both_halves_fused_where_both_are_packed() -> None:
    ops = fused_decode_for(packed(tiny(torch.float32)), enabled=True)
    assert isinstance(ops.fast, FusedCodebookPass) and ops.codebook_pass == FUSED
    assert isinstance(ops.slow, FusedSlowStep) and ops.slow_step == FUSED
    assert ops.prefill == ops.slow.prefill  # the prefill goes with the slow step


def test_off_means_the_python_code() -> None:
    ops = fused_decode_for(packed(tiny(torch.float32)), enabled=False)
    assert ops.fast is fast_codes and ops.slow is slow_step and ops.prefill is slow_prefill
    assert ops.codebook_pass == ops.slow_step == "python (fused_ops is off)"


def test_each_half_says_why_it_is_not_fused() -> None:
    plain = fused_decode_for(tiny(torch.float32), enabled=True)
    assert plain.fast is fast_codes and plain.slow is slow_step
    assert (
        plain.codebook_pass
        == plain.slow_step
        == ("python (the gate and up projections are not fused)")
    )
    half = tiny(torch.float32)
    fuse_gate_up_(half)
    pack_linears_(half.fast_layers)
    half.fast_output = PackedLinear.from_linear(half.fast_output)  # type: ignore[assignment]
    ops = fused_decode_for(half, enabled=True)
    assert isinstance(ops.fast, FusedCodebookPass) and ops.codebook_pass == FUSED
    assert ops.slow is slow_step and ops.prefill is slow_prefill
    assert ops.slow_step == "python (the slow layers are not packed for oneDNN)"


def test_a_library_that_cannot_be_built_leaves_the_python_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "codebook_pass.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(library, "SOURCES", (broken, library.SOURCES[1]))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(fused, "load_library", library.load_library.__wrapped__)
    ops = fused_decode_for(packed(tiny(torch.float32)), enabled=True)
    assert ops.fast is fast_codes and ops.slow is slow_step and ops.prefill is slow_prefill
    assert ops.codebook_pass.startswith("python (building streamtts_fused failed")
    assert ops.slow_step == ops.codebook_pass
    assert "the fused decode ops are unavailable" in caplog.text
