"""Fish-Speech 1.5 text preprocessing (spec §4.5), in upstream's order.

Upstream cleans the whole text, splits it (``split_text``), strips every piece and drops the
pieces with nothing to say, then cleans each piece again when it builds the user message. The
engine receives pieces already split by our segmenter, so each one goes through
:func:`split_piece` (upstream's clean → strip → drop) and then :func:`clean_text` in the prompt
builder, exactly as upstream's pieces do.
"""

from __future__ import annotations

import re
import string

# Emoji blocks deleted by upstream: emoticons, symbols & pictographs, transport & map, flags.
_EMOJI = re.compile(
    "[\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff]"
)
_COMMA_RUN = re.compile(",{2,}")
_NOTHING_TO_SAY = frozenset(string.punctuation + string.whitespace)


def clean_text(text: str) -> str:
    """Strip, normalise curly single quotes to ``'``, drop emoji, collapse runs of ASCII commas.

    The strip comes first (upstream's order), so whitespace next to a deleted emoji at either
    end stays; :func:`split_piece` strips it, as upstream's splitter does.
    """
    text = text.strip()
    text = text.replace("\u2018", "'").replace("\u2019", "'")
    text = _EMOJI.sub("", text)
    return _COMMA_RUN.sub(",", text)


def split_piece(text: str) -> str:
    """What upstream's ``split_text`` makes of one piece of text: cleaned and stripped, or
    ``""`` when nothing is left to say (only whitespace and ASCII punctuation), a piece upstream
    drops: it produces no speech."""
    piece = clean_text(text).strip()
    return "" if all(ch in _NOTHING_TO_SAY for ch in piece) else piece
