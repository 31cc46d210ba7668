"""The fused codebook pass: the Python pass's codes and KV-cache writes, bit for bit."""

from __future__ import annotations

import pytest
import torch

from streamtts.models.fish.fused.codebook_pass import (
    FusedCodebookPass,
    why_not_fused_codebook_pass,
)
from streamtts.models.fish.fused.library import FusedUnavailable, load_library
from streamtts.models.fish.llm.generate import fast_codes, frame_noise
from streamtts.models.fish.llm.llama import DualARTransformer, fuse_gate_up_
from streamtts.models.fish.llm.quantize import quantize_int8_
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams
from streamtts.models.fish.packed import pack_linears_
from tests.models.fish.fused.models import DTYPES, packed, tiny, variants

# Per row: sampled, nearly greedy, hotter with a stronger penalty (the rows must not mix).
ROW_PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.3, top_p=0.05, repetition_penalty=1.0),
    SamplingParams(temperature=1.2, top_p=0.95, repetition_penalty=1.6),
]


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
    load_library()
    for name, model in variants(dtype).items():
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
    model = tiny(torch.float32)
    assert why_not_fused_codebook_pass(model) == "the gate and up projections are not fused"
    fuse_gate_up_(model)
    assert why_not_fused_codebook_pass(model) == "the fast layers are not packed for oneDNN"
    int8 = tiny(torch.float32)
    fuse_gate_up_(int8)
    quantize_int8_(int8)
    assert why_not_fused_codebook_pass(int8) == "the fast layers are not packed for oneDNN"
    pack_linears_(model)
    assert why_not_fused_codebook_pass(model) is None
    with pytest.raises(FusedUnavailable, match="not packed"):
        FusedCodebookPass(int8)


@torch.inference_mode()
def test_it_refuses_another_models_call() -> None:
    load_library()
    model, other = packed(tiny(torch.float32)), packed(tiny(torch.float32, seed=5))
    hidden, code0, window, noise = pass_inputs(other, 1, True, 0)
    sampling = BatchSampling.from_params(ROW_PARAMS[:1])
    with pytest.raises(ValueError, match="another model"):
        FusedCodebookPass(model)(
            other, other.allocate_cache(1, 64), hidden, code0, sampling, window, noise
        )
