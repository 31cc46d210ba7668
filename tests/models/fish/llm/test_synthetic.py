"""synthetic:<size>: real architecture, seeded weights, a tokenizer with real special-id layout."""

from __future__ import annotations

from pathlib import Path

import torch

from streamtts.models.fish.llm.checkpoint import load_fish_llm
from streamtts.models.fish.llm.generate import generate
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.sampling import SamplingParams
from streamtts.models.fish.llm.synthetic import (
    load_synthetic,
    parameter_count,
    synthetic_config,
    synthetic_frame_budget,
    synthetic_tokenizer,
    write_synthetic_checkpoint,
)

FULL_SIZE_PARAMETERS = 637_921_280


def test_full_size_config_matches_release() -> None:
    config = synthetic_config("1.5")
    assert parameter_count(config) == FULL_SIZE_PARAMETERS
    assert (config.vocab_size, config.n_layer, config.dim, config.head_dim) == (
        102048,
        24,
        1024,
        64,
    )
    assert (config.n_local_heads, config.intermediate_size, config.n_fast_layer) == (2, 4096, 4)


def test_full_size_tokenizer_layout() -> None:
    tok = synthetic_tokenizer("1.5")
    assert tok.num_mergeable == 100_000
    assert (tok.im_start_id, tok.im_end_id, tok.voice_id) == (100_003, 100_004, 100_010)
    assert (tok.semantic_begin_id, tok.semantic_end_id) == (100_012, 101_035)
    text = "Hello world, this is 42 — 你好！"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert max(ids) < 100_000 and len(ids) < len(text.encode())  # merges were learned
    prompt = PromptBuilder(tok, 8).build(text)
    assert prompt.shape[0] == 9 and int(prompt[0, -1]) == tok.voice_id


@torch.no_grad()
def test_tiny_model_is_seeded_and_runs() -> None:
    a = load_synthetic("tiny", torch.bfloat16, seed=1)
    b = load_synthetic("tiny", torch.bfloat16, seed=1)
    c = load_synthetic("tiny", torch.bfloat16, seed=2)
    assert {p.dtype for p in a.model.parameters()} == {torch.bfloat16}
    wa, wb, wc = (m.model.output.weight for m in (a, b, c))  # type: ignore[union-attr]
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    prompt = PromptBuilder(a.tokenizer, 8).build("Hello world.")
    result = generate(a.model, prompt, a.tokenizer.im_end_id, 5, SamplingParams())
    assert result.frames.shape[0] == 9 and 1 <= result.frames.shape[1] <= 5
    assert int(result.codes.max()) < 1024 and int(result.codes.min()) >= 0


@torch.no_grad()
def test_written_checkpoint_loads_identically(tmp_path: Path) -> None:
    directory = write_synthetic_checkpoint(tmp_path / "tiny", "tiny", torch.bfloat16, seed=3)
    from_disk = load_fish_llm(directory, torch.float32)
    in_memory = load_synthetic("tiny", torch.bfloat16, seed=3)
    tokens = PromptBuilder(in_memory.tokenizer, 8).build("Hello.")[None]
    got = from_disk.model.forward_train(tokens).logits
    expected = in_memory.model.float().forward_train(tokens).logits
    assert torch.equal(got, expected)
    assert from_disk.tokenizer.special_tokens == in_memory.tokenizer.special_tokens


def test_frame_budget() -> None:
    assert synthetic_frame_budget("Hello world.") == 18
    assert synthetic_frame_budget("你好，世界！") == 20
    assert synthetic_frame_budget("") == 1
    assert synthetic_frame_budget("one two three four") == 36
