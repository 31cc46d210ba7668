"""Tokenizer parity with upstream (fixture ``tok_*`` entries) and special-token layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streamtts.models.fish.llm.tokenizer import (
    PRETOKENIZE_PATTERN,
    FishTokenizer,
    read_mergeable_ranks,
    special_token_strings,
)
from tests.fish_fixture import Index, entries, expected, meta


@pytest.fixture(scope="module")
def tokenizer(fish_fixture_dir: Path) -> FishTokenizer:
    return FishTokenizer.from_file(fish_fixture_dir / "tokenizer.tiktoken")


@pytest.mark.parametrize("entry", entries(r"tok_\w+\.npy"))
def test_encode_matches_upstream(
    entry: str, tokenizer: FishTokenizer, fish_fixture_dir: Path, fish_index: Index
) -> None:
    want = expected(fish_fixture_dir, fish_index, entry)
    got = np.array(tokenizer.encode(meta(fish_index, entry)["text"]), dtype=np.int64)
    np.testing.assert_array_equal(got, want.astype(np.int64))


def test_special_ids_follow_the_file(tokenizer: FishTokenizer, fish_fixture_dir: Path) -> None:
    n = len(read_mergeable_ranks(fish_fixture_dir / "tokenizer.tiktoken"))
    assert tokenizer.num_mergeable == n
    assert len(special_token_strings()) == 1036
    assert tokenizer.im_start_id == n + 3
    assert tokenizer.im_end_id == n + 4
    assert tokenizer.voice_id == n + 10
    assert tokenizer.semantic_begin_id == n + 12
    assert tokenizer.semantic_end_id == n + 1035


def test_special_ids_agree_with_fixture_metadata(
    tokenizer: FishTokenizer, fish_index: Index, fish_fixture_dir: Path
) -> None:
    info = fish_index["tokenizer"]
    assert tokenizer.num_mergeable == info["n_mergeable"]
    assert tokenizer.semantic_begin_id == info["semantic_begin_id"]
    assert tokenizer.semantic_end_id == info["semantic_end_id"]
    assert tokenizer.im_start_id == info["im_start_id"]
    assert tokenizer.im_end_id == info["im_end_id"]
    assert tokenizer.voice_id == info["voice_id"]
    # special_tokens.json is never read by the loader, but it must agree with the computed ids.
    with open(fish_fixture_dir / "special_tokens.json", encoding="utf-8") as f:
        assert json.load(f) == tokenizer.special_tokens


def test_literal_special_tokens_are_encoded(tokenizer: FishTokenizer) -> None:
    ids = tokenizer.encode("a<|im_end|><|semantic:7|>")
    assert ids[-2:] == [tokenizer.im_end_id, tokenizer.semantic_begin_id + 7]


def test_pattern_keeps_the_escaped_question_mark_quirk() -> None:
    assert r"\s+(\?!\S)" in PRETOKENIZE_PATTERN.split("|")
    assert r"\s+(?!\S)" not in PRETOKENIZE_PATTERN


def test_double_space_is_its_own_pretoken(tokenizer: FishTokenizer) -> None:
    # "a  b": the two spaces form one pre-token and "b" carries no leading space (spec §3.1).
    ids = tokenizer.encode("a  b")
    assert tokenizer.decode(ids) == "a  b"
    assert [tokenizer.decode([i]) for i in ids][-1] == "b"
