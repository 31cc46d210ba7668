"""Prompt construction parity (fixture ``prompt_*``), clean_text and the history rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from streamtts.models.fish.llm.config import FishConfig
from streamtts.models.fish.llm.prompt import (
    PromptBuilder,
    Reference,
    history_budget,
    segment_prompt,
    select_history,
)
from streamtts.models.fish.llm.text import clean_text, split_piece
from streamtts.models.fish.llm.tokenizer import FishTokenizer
from tests.fish_fixture import Index, entries, expected, expected_turn, meta

REF_CODES_FILE = "ref_codes.npy"


@pytest.fixture(scope="module")
def builder(fish_fixture_dir: Path) -> PromptBuilder:
    tokenizer = FishTokenizer.from_file(fish_fixture_dir / "tokenizer.tiktoken")
    config = FishConfig.from_json_file(fish_fixture_dir / "config.json")
    return PromptBuilder(tokenizer, config.num_codebooks)


@pytest.mark.parametrize("entry", entries(r"prompt_\w+\.npy"))
def test_prompt_matches_upstream(
    entry: str, builder: PromptBuilder, fish_fixture_dir: Path, fish_index: Index
) -> None:
    info = meta(fish_index, entry)
    references = []
    if "ref_text" in info:
        codes = torch.from_numpy(expected(fish_fixture_dir, fish_index, REF_CODES_FILE))
        references.append(Reference(info["ref_text"], codes))
    got = builder.build(info["text"], references)
    assert got.dtype == torch.int32
    np.testing.assert_array_equal(got.numpy(), expected(fish_fixture_dir, fish_index, entry))


def test_prompt_layout(builder: PromptBuilder) -> None:
    tok = builder.tokenizer
    codes = torch.arange(8 * 3, dtype=torch.int32).view(8, 3)
    prompt = builder.build("Hi.", [Reference("Ref.", codes)])
    assert prompt.shape[0] == builder.num_codebooks + 1
    assert prompt[0, -1] == tok.voice_id
    audio = (prompt[0] >= tok.semantic_begin_id) & (prompt[0] <= tok.semantic_end_id)
    assert int(audio.sum()) == 3
    np.testing.assert_array_equal(prompt[1:, audio].numpy(), codes.numpy())
    np.testing.assert_array_equal(
        prompt[0, audio].numpy(), (codes[0] + tok.semantic_begin_id).numpy()
    )
    assert int(prompt[1:, ~audio].abs().sum()) == 0


def test_clean_text() -> None:
    assert clean_text("  \u2018hi\u2019 ,,, there 😀🚀🇺 ok,, ") == "'hi' , there  ok,"
    assert clean_text("robot 🤖 stays") == "robot 🤖 stays"
    # Upstream strips before deleting emoji: the space an emoji leaves at an end stays here...
    assert clean_text("😀 Hello") == " Hello"


# (text, the piece upstream's splitter keeps): cleaned, then stripped, then dropped when only
# whitespace and ASCII punctuation are left (spec §4.5).
PIECES = [
    ("😀 Hello there.", "Hello there."),  # emoji at the start
    ("Hello there. 😀", "Hello there."),  # at the end
    ("Hello 😀 there.", "Hello  there."),  # between spaces: only the ends are stripped
    ("  🚀😀 🇺  ", ""),  # only emoji: nothing to say
    ("😀!", ""),  # only punctuation left
    ("🤖 stays", "🤖 stays"),  # not in a deleted block
    ("\u2018Hi\u2019,, you 😀", "'Hi', you"),
]


@pytest.mark.parametrize(("text", "piece"), PIECES)
def test_split_piece_follows_upstreams_order(text: str, piece: str) -> None:
    assert split_piece(text) == piece


@pytest.mark.parametrize(("text", "piece"), [p for p in PIECES if p[1]])
def test_prompts_of_emoji_texts_follow_the_spec(
    builder: PromptBuilder, text: str, piece: str
) -> None:
    prompt = builder.build(text)
    prefix = builder.prefix()
    assert torch.equal(prompt[:, : prefix.shape[1]], prefix)
    turn = prompt[:, prefix.shape[1] :]
    assert turn[0].tolist() == expected_turn(builder.tokenizer, piece)
    assert int(turn[1:].abs().sum()) == 0  # no codes in a text turn


def test_a_text_with_nothing_to_say_has_no_prompt(builder: PromptBuilder) -> None:
    with pytest.raises(ValueError, match="nothing to say"):
        builder.build("😀 😀")


def test_select_history_keeps_everything_within_budget() -> None:
    assert select_history([10, 20, 10], budget_tokens=1000) == [0, 1, 2]


def test_select_history_trims_the_middle() -> None:
    # newest first: 10, 50, 10, 50, 10 ; count+L: 20, 110 (>100 at i=1) -> i=1 -> last entry.
    assert select_history([10, 50, 10, 50, 10], budget_tokens=100) == [0, 1, 4]
    # break at i=2 (even) becomes i=1.
    assert select_history([10, 5, 10, 5, 40, 5, 40], budget_tokens=100) == [0, 1, 6]
    # break at i=3 keeps the last three.
    lengths = [10, 5, 10, 5, 10, 5, 10, 5, 10]
    assert select_history(lengths, budget_tokens=40) == [0, 1, 6, 7, 8]


def test_select_history_quirk_when_newest_does_not_fit() -> None:
    # i == 0 -> upstream history[-0:] is the whole list, after the first two entries.
    assert select_history([10, 10, 10, 500], budget_tokens=100) == [0, 1, 0, 1, 2, 3]
    assert select_history([10, 10, 500], budget_tokens=100) == [0, 1, 0, 1, 2]
    # no trimming when the history is short: 2 entries or fewer than i + 2.
    assert select_history([10, 500], budget_tokens=100) == [0, 1]


def test_history_budget_and_segment_prompt(builder: PromptBuilder) -> None:
    prefix = builder.prefix()
    assert history_budget(2048, prefix.shape[1]) == 2048 - 1024 - prefix.shape[1]
    turn0, turn1 = builder.turn("First part."), builder.turn("Second part.")
    frames0 = torch.zeros(9, 7, dtype=torch.int32)
    prompt = segment_prompt(prefix, [turn0, frames0, turn1], max_length=4096)
    np.testing.assert_array_equal(
        prompt.numpy(), torch.cat([prefix, turn0, frames0, turn1], 1).numpy()
    )
    assert torch.equal(builder.build("First part."), torch.cat([prefix, turn0], 1))


def test_every_turn_begins_with_its_opening(builder: PromptBuilder) -> None:
    """What a voice keeps with its prefix (streamtts.fish.prefixes) is what every turn begins
    with, whatever its text."""
    opening = builder.turn_opening()
    assert opening[0].tolist() == builder.tokenizer.encode("<|im_start|>user\n")
    for text in ("Hi.", "A longer sentence, with a comma, and more words."):
        turn = builder.turn(text)
        assert torch.equal(turn[:, : opening.shape[1]], opening)
