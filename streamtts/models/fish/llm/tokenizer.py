"""Fish-Speech 1.5 tokenizer: tiktoken byte-level BPE plus 1036 special tokens (spec §3.1–3.2).

The mergeable ranks come from ``tokenizer.tiktoken`` (``<base64 bytes> <rank>`` per line). The
special tokens get ids ``N + index`` in the fixed order below, where ``N`` is the number of
entries in the file. ``special_tokens.json`` is ignored, as upstream ignores it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path

import tiktoken

# Pre-tokenisation pattern, alternatives in order. The seventh is, verbatim, ``\s+(\?!\S)``
# (an escaped question mark, not a look-ahead): an upstream quirk that is part of the format.
PRETOKENIZE_PATTERN = "|".join(
    [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
        r"\p{P}",
        r"[^\r\n\p{L}\p{N}]?\p{L}+",
        r"\p{N}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(\?!\S)",
        r"\s+",
    ]
)

BEGIN_OF_TEXT = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TEXT = "<|text|>"
VOICE = "<|voice|>"
INTERLEAVE = "<|interleave|>"
NUM_SEMANTIC_TOKENS = 1024


def special_token_strings() -> list[str]:
    """The 1036 special tokens in id order (index i gets id N + i)."""
    head = [BEGIN_OF_TEXT, END_OF_TEXT, PAD, IM_START, IM_END]
    head += [f"<|placeholder:{i}|>" for i in range(4)]
    head += [TEXT, VOICE, INTERLEAVE]
    return head + [f"<|semantic:{i}|>" for i in range(NUM_SEMANTIC_TOKENS)]


# Input is encoded in slices of this many characters, as upstream does.
_ENCODE_SLICE_CHARS = 400_000


def read_mergeable_ranks(path: Path) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file; empty lines are skipped, rank = token id."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            stripped = line.strip()
            if not stripped:
                continue
            try:
                token_b64, rank = stripped.split()
                ranks[base64.b64decode(token_b64)] = int(rank)
            except ValueError as exc:
                raise ValueError(f"{path}:{line_no}: not '<base64> <rank>'") from exc
    return ranks


class FishTokenizer:
    """Text ↔ token ids. ``encode`` turns literal special-token strings into their ids."""

    def __init__(self, mergeable_ranks: Mapping[bytes, int], name: str = "fish") -> None:
        self.num_mergeable = len(mergeable_ranks)
        n = self.num_mergeable
        self.special_tokens = {tok: n + i for i, tok in enumerate(special_token_strings())}
        self._encoding = tiktoken.Encoding(
            name=name,
            pat_str=PRETOKENIZE_PATTERN,
            mergeable_ranks=dict(mergeable_ranks),
            special_tokens=self.special_tokens,
        )
        self.im_start_id = self.special_tokens[IM_START]
        self.im_end_id = self.special_tokens[IM_END]
        self.voice_id = self.special_tokens[VOICE]
        self.pad_id = self.special_tokens[PAD]
        self.semantic_begin_id = self.special_tokens["<|semantic:0|>"]
        self.semantic_end_id = self.special_tokens[f"<|semantic:{NUM_SEMANTIC_TOKENS - 1}|>"]

    @classmethod
    def from_file(cls, path: Path) -> FishTokenizer:
        return cls(read_mergeable_ranks(path), name=path.stem)

    @property
    def vocab_size_min(self) -> int:
        """The smallest model vocabulary that holds every id this tokenizer can produce."""
        return self.num_mergeable + len(self.special_tokens)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for start in range(0, len(text), _ENCODE_SLICE_CHARS):
            piece = text[start : start + _ENCODE_SLICE_CHARS]
            ids += self._encoding.encode(piece, allowed_special="all")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._encoding.decode(ids)

    def semantic_id(self, code: int) -> int:
        """Token id of ``<|semantic:code|>``."""
        return self.semantic_begin_id + code
