"""Fish-Speech 1.5 TTS prompt construction (spec §3.3–3.4, §4.4).

A prompt is an int32 tensor ``[num_codebooks + 1, L]``: row 0 holds token ids, rows 1.. hold the
codec codes at audio positions (0 elsewhere). Every part of a message (header, text, voice
marker, codes, ``<|im_end|>``) is tokenised separately, so BPE never merges across parts.

Layout for segment k of an utterance::

    prefix  = system message + (user transcript, assistant <|voice|> codes <|im_end|>) per reference
    turn_k  = user message (segment text) + "<|im_start|>assistant\\n" + "<|voice|>"
    prompt  = prefix + selected history + turn_k

``prefix`` is identical for every segment and request of a voice (its KV can be cached).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from streamtts.models.fish.llm.text import clean_text, split_piece
from streamtts.models.fish.llm.tokenizer import IM_END, IM_START, VOICE, FishTokenizer

SYSTEM_TEXT = "Speak out the provided text."
# Context tokens upstream reserves for generation when trimming history (spec §4.4).
GENERATION_RESERVE_TOKENS = 1024
# Total context budget: 2048 in the upstream CLI, 4096 in the upstream server.
DEFAULT_MAX_LENGTH = 4096


@dataclass(frozen=True)
class Reference:
    """A voice-cloning reference: its transcript and codec codes ``[num_codebooks, T]``."""

    text: str
    codes: torch.Tensor


class PromptBuilder:
    """Encodes messages into ``[num_codebooks + 1, L]`` int32 prompt tensors."""

    def __init__(self, tokenizer: FishTokenizer, num_codebooks: int) -> None:
        self.tokenizer = tokenizer
        self.num_codebooks = num_codebooks

    def text_part(self, text: str) -> torch.Tensor:
        """Tokenise one part: ``[C+1, n]`` with codes rows zero."""
        ids = torch.tensor(self.tokenizer.encode(text), dtype=torch.int32)  # [n]
        part = torch.zeros(self.num_codebooks + 1, ids.numel(), dtype=torch.int32)
        part[0] = ids
        return part

    def codes_part(self, codes: torch.Tensor) -> torch.Tensor:
        """Codec frames ``[>=C, T]`` → ``[C+1, T]``: row 0 = semantic id of codebook 0."""
        if codes.dim() != 2 or codes.shape[0] < self.num_codebooks:
            raise ValueError(f"codes must be [>= {self.num_codebooks}, T], got {list(codes.shape)}")
        frames = codes[: self.num_codebooks].to(torch.int32)  # [C, T]
        row0 = frames[0:1] + self.tokenizer.semantic_begin_id  # [1, T]
        return torch.cat([row0, frames], dim=0)

    def header(self, role: str) -> torch.Tensor:
        """A message's first part, ``<|im_start|>{role}\n``: ``[C+1, h]``."""
        return self.text_part(f"{IM_START}{role}\n")

    def message(
        self, role: str, parts: Sequence[str | torch.Tensor], *, end: bool = True
    ) -> torch.Tensor:
        """One chat message: header, parts (text or codes), ``<|im_end|>`` if ``end``."""
        encoded = [self.header(role)]
        for part in parts:
            encoded.append(self.text_part(part) if isinstance(part, str) else self.codes_part(part))
        if end:
            encoded.append(self.text_part(IM_END))
        return torch.cat(encoded, dim=1)

    def system(self) -> torch.Tensor:
        return self.message("system", [SYSTEM_TEXT])

    def reference(self, reference: Reference) -> torch.Tensor:
        user = self.message("user", [clean_text(reference.text)])
        assistant = self.message("assistant", [VOICE, reference.codes])
        return torch.cat([user, assistant], dim=1)

    def prefix(self, references: Sequence[Reference] = ()) -> torch.Tensor:
        """System message plus every reference pair: the part shared by all segments of a voice."""
        return torch.cat([self.system()] + [self.reference(r) for r in references], dim=1)

    def turn_opening(self) -> torch.Tensor:
        """The columns every :meth:`turn` begins with (the user message's header), whatever its
        text: after a voice's prefix they are the same for every first segment of that voice,
        so their keys/values can be kept with the prefix's (:mod:`streamtts.fish.prefixes`)."""
        return self.header("user")

    def turn(self, text: str) -> torch.Tensor:
        """User message with the segment text, then the assistant generation prefix.

        ``text`` is a piece as upstream's splitter leaves it (:func:`split_piece`); it is
        cleaned once more here, as upstream's message builder does."""
        user = self.message("user", [clean_text(text)])
        assistant = self.message("assistant", [VOICE], end=False)
        return torch.cat([user, assistant], dim=1)

    def build(self, text: str, references: Sequence[Reference] = ()) -> torch.Tensor:
        """The prompt ``[C+1, L]`` upstream generates a one-piece ``text`` from. Raises
        ``ValueError`` for a text with nothing to say (upstream generates nothing for it)."""
        piece = split_piece(text)
        if not piece:
            raise ValueError(f"nothing to say in {text!r}")
        return torch.cat([self.prefix(references), self.turn(piece)], dim=1)


def history_budget(max_length: int, prefix_length: int) -> int:
    """Tokens of history upstream allows: ``max_length - 1024 - len(prefix)``."""
    return max_length - GENERATION_RESERVE_TOKENS - prefix_length


def select_history(entry_lengths: Sequence[int], budget_tokens: int) -> list[int]:
    """Indices of the history entries to keep, reproducing upstream's trimming rule exactly.

    ``entry_lengths`` are oldest first: ``[turn_0, frames_0, turn_1, frames_1, ..., turn_k]``
    (the newest entry is the turn being generated). The first two entries are always kept. The
    rule's quirks are kept on purpose: each entry is counted twice in the budget test, and when
    even the newest entry does not fit the result repeats the first two entries before the whole
    history (upstream's ``history[-0:]``).
    """
    if not entry_lengths:
        raise ValueError("history must hold at least the current turn")
    count = 0
    newest_first = list(reversed(entry_lengths))
    stop = len(newest_first) - 1
    for i, length in enumerate(newest_first):
        count += length
        if count + length > budget_tokens:
            stop = i
            break
    if stop != 0 and stop % 2 == 0:
        stop -= 1
    n = len(entry_lengths)
    if stop < n - 2:
        tail = list(range(n)) if stop == 0 else list(range(n - stop, n))
        return [0, 1] + tail
    return list(range(n))


def segment_prompt(
    prefix: torch.Tensor, history: Sequence[torch.Tensor], max_length: int = DEFAULT_MAX_LENGTH
) -> torch.Tensor:
    """Prompt ``[C+1, L]`` for the newest turn: ``prefix`` + the history entries upstream keeps.

    ``history`` ends with the current turn (from :meth:`PromptBuilder.turn`); earlier entries
    alternate turn / generated frames (prefill frame through ``<|im_end|>``, ``[C+1, n]``).
    """
    budget = history_budget(max_length, prefix.shape[1])
    kept = select_history([entry.shape[1] for entry in history], budget)
    return torch.cat([prefix] + [history[i] for i in kept], dim=1)
