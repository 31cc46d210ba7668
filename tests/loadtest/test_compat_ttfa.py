"""The real-client TTFA measurement's bookkeeping (the clients themselves run in
tests/server/test_real_clients.py)."""

from __future__ import annotations

import pytest

from loadtest.compat import tokens
from loadtest.compat_ttfa import CLIENTS, ttfa_ms


def test_ttfa_is_first_token_to_first_audio_of_the_first_utterance() -> None:
    events = [
        {"t": 1.0, "event": "turn"},
        {"t": 1.1, "event": "text", "reader": "first"},
        {"t": 1.2, "event": "text", "reader": "first"},
        {"t": 1.45, "event": "chunk", "reader": "first"},
        {"t": 1.5, "event": "audio"},
    ]
    assert ttfa_ms(events) == pytest.approx(350.0)
    # A later context's audio (the Cartesia SDK's third reader) does not count.
    other = [{"t": 1.0, "event": "text"}, {"t": 1.2, "event": "chunk", "reader": "third"}]
    with pytest.raises(StopIteration):
        ttfa_ms(other)


def test_every_client_gets_a_url_of_the_right_scheme() -> None:
    for script, arguments, _ in CLIENTS.values():
        args = arguments("https://127.0.0.1:8443")
        urls = [a for a in args if "://" in a]
        assert urls and all(u.startswith(("https://", "wss://")) for u in urls), script


def test_tokens_carry_their_leading_spaces() -> None:
    assert tokens("Hello there, you.") == ["Hello", " there,", " you."]
    assert "".join(tokens("a b  c")) == "a b  c"
