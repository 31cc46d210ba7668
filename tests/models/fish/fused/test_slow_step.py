"""The fused slow step and prefill: the Python step's and prefill's logits, hidden states and
KV-cache writes, bit for bit."""

from __future__ import annotations

import pytest
import torch

from streamtts.models.fish.fused.library import FusedUnavailable, load_library
from streamtts.models.fish.fused.slow_step import FusedSlowStep, why_not_fused_slow_step
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache, fuse_gate_up_
from streamtts.models.fish.packed import pack_linears_
from tests.models.fish.fused.models import DTYPES, packed, tiny, variants

CACHE_SLOTS, CACHE_LEN = 4, 512
# Rows in other slots than their index and at far-apart positions (each masks its own keys).
SLOTS, POSITIONS = [2, 0, 3], [100, 7, 300]


def random_cache(model: DualARTransformer, seed: int) -> KVCache:
    """A cache full of keys and values, so that reading a wrong slot or position shows."""
    cache = model.allocate_cache(CACHE_SLOTS, CACHE_LEN)
    gen = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return cache


def step_tokens(model: DualARTransformer, batch: int, seed: int) -> torch.Tensor:
    """[B, C+1, 1] int32: row 0 a semantic token (its codebooks count), the others not."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    shape = (batch, cfg.num_codebooks + 1, 1)
    tokens = torch.randint(0, cfg.codebook_size, shape, generator=gen, dtype=torch.int32)
    tokens[0, 0] = model.semantic_begin_id + 5
    return tokens


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@torch.inference_mode()
def test_the_fused_step_gives_the_python_step_bits(dtype: torch.dtype) -> None:
    """For 1 and 3 rows, in each attention kernel the model runs (SDPA and the fp32 decode
    kernel), three steps in a row (each reads what the last wrote)."""
    load_library()
    for name, model in variants(dtype).items():
        fused_step = FusedSlowStep(model)
        for kernel in ("sdpa", "fp32"):
            model.decode_kernel = kernel
            for batch in (1, 3):
                python_cache, fused_cache = random_cache(model, batch), random_cache(model, batch)
                slots = torch.tensor(SLOTS[:batch])
                for step in range(3):
                    positions = torch.tensor(POSITIONS[:batch]) + step
                    tokens = step_tokens(model, batch, step)
                    kv_len = int(positions.max()) + 1
                    args = (tokens, slots, positions, kv_len)
                    want = model.decode_slow(python_cache, *args)
                    got = fused_step(model, fused_cache, *args)
                    where = (name, kernel, batch, step)
                    assert got.logits.shape == want.logits.shape, where
                    assert torch.equal(got.logits, want.logits), where
                    assert torch.equal(got.hidden, want.hidden), where
                    assert torch.equal(fused_cache.k, python_cache.k), where
                    assert torch.equal(fused_cache.v, python_cache.v), where
        model.decode_kernel = "auto"


def prompt_tokens(model: DualARTransformer, length: int, seed: int) -> torch.Tensor:
    """[C+1, S] int32: every other column a semantic token (its codebooks count)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (model.config.num_codebooks + 1, length)
    tokens = torch.randint(0, model.config.codebook_size, shape, generator=gen, dtype=torch.int32)
    tokens[0, ::2] = model.semantic_begin_id + 3
    return tokens


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@torch.inference_mode()
def test_the_fused_prefill_gives_the_python_prefill_bits(dtype: torch.dtype) -> None:
    """A prompt from the start, one after cached keys (all positions' outputs), one token; the
    prompt's rows few enough for one thread and enough to be split between threads."""
    load_library()
    for name, model in variants(dtype).items():
        fused_step = FusedSlowStep(model)
        for start, length, return_all in ((0, 13, False), (37, 20, True), (100, 1, False)):
            python_cache, fused_cache = random_cache(model, length), random_cache(model, length)
            tokens = prompt_tokens(model, length, start)
            args = (tokens, SLOTS[0], start, return_all)
            want = model.prefill(python_cache, *args)
            got = fused_step.prefill(model, fused_cache, *args)
            where = (name, start, length)
            vocab = model.config.vocab_size
            assert got.logits.shape == ((length, vocab) if return_all else (vocab,)), where
            assert torch.equal(got.logits, want.logits), where
            assert torch.equal(got.hidden, want.hidden), where
            assert torch.equal(fused_cache.k, python_cache.k), where
            assert torch.equal(fused_cache.v, python_cache.v), where


@torch.inference_mode()
def test_the_fused_prefill_refuses_a_prompt_past_the_cache() -> None:
    load_library()
    model = packed(tiny(torch.float32))
    cache = random_cache(model, 0)
    with pytest.raises(ValueError, match="exceeds the cache"):
        FusedSlowStep(model).prefill(model, cache, prompt_tokens(model, 20, 0), 0, CACHE_LEN - 10)


def test_it_applies_only_to_packed_slow_layers_on_the_cpu() -> None:
    model = tiny(torch.float32)
    assert why_not_fused_slow_step(model) == "the gate and up projections are not fused"
    fuse_gate_up_(model)
    assert why_not_fused_slow_step(model) == "the slow layers are not packed for oneDNN"
    with pytest.raises(FusedUnavailable, match="not packed"):
        FusedSlowStep(model)
    pack_linears_(model)
    assert why_not_fused_slow_step(model) is None


@torch.inference_mode()
def test_it_refuses_another_models_call() -> None:
    load_library()
    model, other = packed(tiny(torch.float32)), packed(tiny(torch.float32, seed=5))
    positions = torch.tensor([3])
    with pytest.raises(ValueError, match="another model"):
        FusedSlowStep(model)(
            other, random_cache(other, 0), step_tokens(other, 1, 0), torch.tensor([0]), positions, 4
        )
