"""Joining compatibility clients' text pieces."""

from __future__ import annotations

import pytest

from streamtts.server.dialects.text import join_piece


@pytest.mark.parametrize(
    ("previous", "piece", "joined"),
    [
        ("", "Hello", "Hello"),  # the start of a context
        ("speech test.", "It checks", " It checks"),  # Pipecat's sentences have no spaces
        ('he said "Stop!"', "Then", " Then"),  # closing quotes after the sentence end
        ("Really?", "Yes.", " Yes."),
        ("Hello there, ", "this ", "this "),  # pieces that carry their own spaces
        ("there, ", " this ", " this "),  # doubled spaces: the segmenter speaks one
        ("Hel", "lo", "lo"),  # an LLM token inside a word
        ("3.", "14", "14"),  # a number, not a sentence end
        ("e.g.", "the", "the"),  # lowercase: never a new sentence
        ("你好。", "再见", "再见"),  # CJK sentences need no space
        ("Done.", " Next", " Next"),
    ],
)
def test_join_piece(previous: str, piece: str, joined: str) -> None:
    assert join_piece(previous, piece) == joined
