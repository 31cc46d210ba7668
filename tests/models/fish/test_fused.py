"""The fused codebook pass: the Python pass's codes and KV-cache writes, bit for bit, where it
applies; the Python pass, with the reason, where it does not or cannot be built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamtts.models.fish import fused
from streamtts.models.fish.fused import (
    FUSED,
    FusedCodebookPass,
    FusedPassUnavailable,
    codebook_pass_for,
    why_not_fused,
)
from streamtts.models.fish.llm.checkpoint import build_model, load_fish_llm
from streamtts.models.fish.llm.config import FishConfig
from streamtts.models.fish.llm.generate import fast_codes, frame_noise
from streamtts.models.fish.llm.llama import DualARTransformer, fuse_gate_up_
from streamtts.models.fish.llm.quantize import quantize_int8_
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams
from streamtts.models.fish.llm.synthetic import (
    SYNTHETIC_SIZES,
    load_synthetic,
    synthetic_state_dict,
    synthetic_tokenizer,
)
from streamtts.models.fish.packed import pack_linears_, packs
from tests.fish_fixture import fixture_dir, require_dir

DTYPES = [torch.float32] + ([torch.bfloat16] if packs(torch.device("cpu"), torch.bfloat16) else [])
# Per row: sampled, nearly greedy, hotter with a stronger penalty (the rows must not mix).
ROW_PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.3, top_p=0.05, repetition_penalty=1.0),
    SamplingParams(temperature=1.2, top_p=0.95, repetition_penalty=1.6),
]


def packed(model: DualARTransformer) -> DualARTransformer:
    fuse_gate_up_(model)
    pack_linears_(model)
    return model.eval().requires_grad_(False)


def with_fast_qkv_bias(dtype: torch.dtype) -> DualARTransformer:
    config = FishConfig.from_dict({**SYNTHETIC_SIZES["tiny"], "fast_attention_qkv_bias": True})
    state = synthetic_state_dict(config, dtype, seed=9)
    return build_model(state, config, synthetic_tokenizer("tiny"), dtype, "cpu")


def models(dtype: torch.dtype) -> dict[str, DualARTransformer]:
    return {
        "synthetic": load_synthetic("tiny", dtype, "cpu", seed=4).model,
        "fast qkv bias": with_fast_qkv_bias(dtype),
        "fixture": load_fish_llm(require_dir(fixture_dir()), dtype, "cpu").model,
    }


def pass_inputs(
    model: DualARTransformer, batch: int, windows: bool, seed: int
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    hidden = (torch.randn(batch, cfg.dim, generator=gen) * 3).to(model.dtype)
    code0 = torch.randint(0, cfg.codebook_size, (batch,), generator=gen)
    shape = (batch, cfg.num_codebooks + 1, 16)
    window = torch.randint(0, cfg.codebook_size, shape, generator=gen) if windows else None
    noise = frame_noise(model, batch, [gen] * batch).fast
    return hidden, code0, window, noise  # type: ignore[return-value]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@torch.inference_mode()
def test_the_fused_pass_gives_the_python_pass_bits(dtype: torch.dtype) -> None:
    """Codes and both fast KV caches equal the Python pass's, for 1 and 3 rows each with its
    own sampling, with and without repetition windows, and over several frames (a pass
    starts its cache rows anew; the codes differ between frames, so the op is not idle)."""
    fused.load_library()
    for name, plain in models(dtype).items():
        model = packed(plain)
        fused_pass = FusedCodebookPass(model)
        python_cache = model.allocate_cache(3, 64)
        fused_cache = model.allocate_cache(3, 64)
        seen: set[tuple[int, ...]] = set()
        for batch in (1, 3):
            sampling = BatchSampling.from_params(ROW_PARAMS[:batch])
            for windows in (True, False):
                for frame in range(3):
                    hidden, code0, window, noise = pass_inputs(model, batch, windows, frame)
                    args = (hidden, code0, sampling, window, noise)
                    want = fast_codes(model, python_cache, *args)
                    got = fused_pass(model, fused_cache, *args)
                    assert got.dtype == want.dtype == torch.int64, name
                    assert torch.equal(got, want), (name, batch, windows, frame)
                    assert torch.equal(fused_cache.fast_k, python_cache.fast_k), name
                    assert torch.equal(fused_cache.fast_v, python_cache.fast_v), name
                    seen.add(tuple(got[0].tolist()))
        assert len(seen) > 6, name


def test_it_applies_only_to_packed_fast_layers_on_the_cpu() -> None:
    model = load_synthetic("tiny", torch.float32, "cpu", seed=4).model
    assert why_not_fused(model) == "the gate and up projections are not fused"
    fuse_gate_up_(model)
    assert why_not_fused(model) == "the fast layers are not packed for oneDNN"
    int8 = load_synthetic("tiny", torch.float32, "cpu", seed=4).model
    fuse_gate_up_(int8)
    quantize_int8_(int8)
    assert why_not_fused(int8) == "the fast layers are not packed for oneDNN"
    pack_linears_(model)
    assert why_not_fused(model) is None
    with pytest.raises(FusedPassUnavailable, match="not packed"):
        FusedCodebookPass(int8)


def test_codebook_pass_for_says_what_runs_and_why() -> None:
    model = packed(load_synthetic("tiny", torch.float32, "cpu", seed=4).model)
    fast, what = codebook_pass_for(model, enabled=True)
    assert isinstance(fast, FusedCodebookPass) and what == FUSED
    fast, what = codebook_pass_for(model, enabled=False)
    assert fast is fast_codes and what == "python (fused_codebook_pass is off)"
    plain = load_synthetic("tiny", torch.float32, "cpu", seed=4).model
    fast, what = codebook_pass_for(plain, enabled=True)
    assert fast is fast_codes
    assert what == "python (the gate and up projections are not fused)"
    other = packed(load_synthetic("tiny", torch.float32, "cpu", seed=5).model)
    with pytest.raises(ValueError, match="another model"):
        FusedCodebookPass(model)(other, other.allocate_cache(1, 64), *_one_row(other))


def _one_row(model: DualARTransformer) -> tuple[object, ...]:
    hidden, code0, window, noise = pass_inputs(model, 1, True, 0)
    return hidden, code0, BatchSampling.from_params(ROW_PARAMS[:1]), window, noise


def test_a_library_that_cannot_be_built_leaves_the_python_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A source the compiler rejects (as a missing compiler or ninja would fail): a clear
    reason, the Python pass, and nothing half-written where a later start would load it."""
    broken = tmp_path / "codebook_pass.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(fused, "SOURCE", broken)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(fused, "load_library", fused.load_library.__wrapped__)
    library = fused.library_path()
    assert library.is_relative_to(tmp_path / "extensions")
    model = packed(load_synthetic("tiny", torch.float32, "cpu", seed=4).model)
    fast, what = codebook_pass_for(model, enabled=True)
    assert fast is fast_codes
    assert what.startswith("python (building codebook_pass.cpp failed")
    assert "the fused codebook pass is unavailable" in caplog.text
    assert not library.exists()


def test_the_library_is_kept_under_a_key_of_its_source_flags_and_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    first = fused.library_path()
    assert first.parent.parent == tmp_path and first.name == "streamtts_codebook_pass.so"
    monkeypatch.setattr(fused, "BUILD_FLAGS", ("-O3",))
    assert fused.library_path() != first
    monkeypatch.setattr(fused, "BUILD_FLAGS", ("-O2",))
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert fused.library_path() != first
