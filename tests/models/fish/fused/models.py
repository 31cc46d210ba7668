"""Models the fused ops are checked on: synthetic, with biases and a tied head, the fixture."""

from __future__ import annotations

import torch

from streamtts.models.fish.fused.pairs import pair_linears_, why_not_paired
from streamtts.models.fish.llm.checkpoint import build_model, load_fish_llm
from streamtts.models.fish.llm.config import FishConfig
from streamtts.models.fish.llm.llama import DualARTransformer, fuse_gate_up_
from streamtts.models.fish.llm.synthetic import (
    SYNTHETIC_SIZES,
    load_synthetic,
    synthetic_state_dict,
    synthetic_tokenizer,
)
from streamtts.models.fish.packed import pack_linears_, packs
from tests.fish_fixture import fixture_dir, require_dir

# fp32 packs everywhere oneDNN runs; bf16 where the CPU has native bf16 (as ``dtype auto``).
DTYPES = [torch.float32] + ([torch.bfloat16] if packs(torch.device("cpu"), torch.bfloat16) else [])


def packed(model: DualARTransformer) -> DualARTransformer:
    fuse_gate_up_(model)
    pack_linears_(model)
    return model.eval().requires_grad_(False)


def tiny(dtype: torch.dtype, seed: int = 4) -> DualARTransformer:
    return load_synthetic("tiny", dtype, "cpu", seed=seed).model


def with_biases_and_a_tied_head(dtype: torch.dtype) -> DualARTransformer:
    """QKV biases in both transformers, and the output head tied to the text embeddings."""
    overrides = {
        "attention_qkv_bias": True,
        "fast_attention_qkv_bias": True,
        "tie_word_embeddings": True,
    }
    config = FishConfig.from_dict({**SYNTHETIC_SIZES["tiny"], **overrides})
    state = synthetic_state_dict(config, dtype, seed=9)
    return build_model(state, config, synthetic_tokenizer("tiny"), dtype, "cpu")


def with_heads_of_part_tasks(dtype: torch.dtype) -> DualARTransformer:
    """Heads whose rows are not a multiple of 64 (as Fish-Speech 1.5's 102 048-row text head):
    paired, the last task is padded."""
    overrides = {"vocab_size": 1700, "codebook_size": 1000}
    config = FishConfig.from_dict({**SYNTHETIC_SIZES["tiny"], **overrides})
    state = synthetic_state_dict(config, dtype, seed=5)
    return build_model(state, config, synthetic_tokenizer("tiny"), dtype, "cpu")


def paired(model: DualARTransformer) -> DualARTransformer:
    """Packed, with every layer that fits in the pairs layout (as bf16 serves with
    AVX512-BF16 and no AMX)."""
    fuse_gate_up_(model)
    assert pair_linears_(model, slow=True) > 0
    return packed(model)


def variants(dtype: torch.dtype) -> dict[str, DualARTransformer]:
    """Each packed (gate and up fused, products in oneDNN's layout); for bf16 on a CPU with
    AVX512-BF16 also with the layers paired (row_linear)."""
    models = {
        "synthetic": packed(tiny(dtype)),
        "biases, tied head": packed(with_biases_and_a_tied_head(dtype)),
        "fixture": packed(load_fish_llm(require_dir(fixture_dir()), dtype, "cpu").model),
    }
    if dtype == torch.bfloat16 and why_not_paired() is None:
        models |= {
            "synthetic, paired": paired(tiny(dtype)),
            "biases, tied head, paired": paired(with_biases_and_a_tied_head(dtype)),
            "heads of part tasks, paired": paired(with_heads_of_part_tasks(dtype)),
            "fixture, paired": paired(
                load_fish_llm(require_dir(fixture_dir()), dtype, "cpu").model
            ),
        }
    return models
