"""Joining the text pieces a compatibility client sends into one context's text.

Clients of the same protocol cut text differently: an LLM token stream carries its own spaces
(``"Hello there, this "``, ``"is a "``), the ElevenLabs SDK ends every chunk with a space, and
Pipecat sends whole sentences with none (``"...a test."`` then ``"It checks..."``). Pieces are
concatenated as sent, except that a piece starting with a capital letter right after a sentence
end gets a space, so sentences never run together (``"test.It"``). Whitespace runs need no care:
the segmenter speaks every run as one space.
"""

from __future__ import annotations

from typing import Final

from streamtts.segmenter import CLOSERS, SENTENCE_TERMINATORS

_SPACELESS_TERMINATORS: Final = frozenset("。！？｡")  # CJK sentences need no space after them


def join_piece(previous: str, piece: str) -> str:
    """``piece`` as it is to be appended after text ending in ``previous`` (its last
    characters; ``""`` at the start of a context)."""
    if not previous or not piece or piece[0].isspace() or not piece[0].isupper():
        return piece
    end = previous.rstrip("".join(CLOSERS))
    if end and end[-1] in SENTENCE_TERMINATORS and end[-1] not in _SPACELESS_TERMINATORS:
        return " " + piece
    return piece
