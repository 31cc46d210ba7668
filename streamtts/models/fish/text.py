"""Fish-Speech 1.5 text preprocessing (spec §4.5): ``clean_text``."""

from __future__ import annotations

import re

# Emoji blocks deleted by upstream: emoticons, symbols & pictographs, transport & map, flags.
_EMOJI = re.compile(
    "[\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff]"
)
_COMMA_RUN = re.compile(",{2,}")


def clean_text(text: str) -> str:
    """Strip, normalise curly single quotes to ``'``, drop emoji, collapse runs of ASCII commas."""
    text = text.strip()
    text = text.replace("\u2018", "'").replace("\u2019", "'")
    text = _EMOJI.sub("", text)
    return _COMMA_RUN.sub(",", text)
