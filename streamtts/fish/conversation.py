"""One stream's iterative prompt: the history of turns and generated frames, and which tokens
its KV-cache slot already holds, so a new segment prefills only what its prompt adds.

Upstream re-prefills the whole prompt for every text chunk. Here a stream keeps its slot: a new
segment's prompt (prefix + the history entries upstream keeps + the new turn) usually extends
what the slot holds (the previous prompt and its frames), so only the difference is prefilled.
Pure tensor bookkeeping on the CPU; the generator thread calls it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from streamtts.models.fish.llm.prompt import segment_prompt

log = logging.getLogger(__name__)

# Positions a segment's prompt must leave free in the cache for its frames.
MIN_FRAMES_ROOM = 64


@dataclass(frozen=True)
class Checkpoint:
    """A conversation as it was before a segment was planned, and the first slot column that
    segment writes (see :meth:`Conversation.rewind`)."""

    cached_tokens: torch.Tensor | None
    history: tuple[torch.Tensor, ...]
    written_from: int


@dataclass(frozen=True)
class Plan:
    prompt: torch.Tensor  # [C+1, L]
    prefill_from: int  # the first prompt column the slot does not hold yet (< L)
    copy_prefix: bool  # copy the voice prefix's cached keys/values into the slot first
    keep_prefix: bool  # the prefix is not cached: keep it once this prompt is prefilled
    undo: Checkpoint  # where to rewind to if the segment is dropped unheard


@dataclass
class Conversation:
    # Token columns [C+1, P] whose keys/values sit in positions 0..P-1 of the slot; None while
    # the slot holds nothing of this stream (so nothing is made on the event loop).
    cached_tokens: torch.Tensor | None = None
    # Turn, frames, turn, frames, ... (each [C+1, n], on the CPU).
    history: list[torch.Tensor] = field(default_factory=list)

    def plan(
        self,
        prefix: torch.Tensor,
        turn: torch.Tensor,
        max_prompt_tokens: int,
        max_seq_len: int,
        kept: torch.Tensor | None,
    ) -> Plan:
        """Add ``turn`` to the history and plan its segment's prompt. ``kept``: the columns
        whose keys/values the voice keeps (its prefix and a turn's opening, copied into the
        slot for a first segment), or None while it keeps none (the first segment prefills
        them)."""
        first = self.cached_tokens is None
        before, history = self.cached_tokens, tuple(self.history)
        prefix_cached = kept is not None
        if self.cached_tokens is not None:
            cached = self.cached_tokens
        else:
            cached = kept if kept is not None else prefix[:, :0]
        self.history.append(turn)
        prompt = segment_prompt(prefix, self.history, max_prompt_tokens)
        if prompt.shape[1] + MIN_FRAMES_ROOM > max_seq_len:
            # Upstream's trimming rule keeps the whole history when even the newest entry
            # exceeds its budget (a context shorter than its 1024-frame reserve); that prompt
            # would not fit the cache, so the segment starts afresh from the prefix instead.
            log.warning("history does not fit %d cached tokens: dropped", max_seq_len)
            self.history[:] = [turn]
            prompt = torch.cat([prefix, turn], dim=1)
        self.cached_tokens = cached
        # At least the last column is prefilled: its logits start the segment.
        prefill_from = min(common_prefix(cached, prompt), prompt.shape[1] - 1)
        undo = Checkpoint(before, history, prefill_from)
        return Plan(
            prompt, prefill_from, first and prefix_cached, first and not prefix_cached, undo
        )

    def rewind(self, checkpoint: Checkpoint) -> None:
        """Back to ``checkpoint``: the segment planned after it was dropped unheard (a prepared
        segment whose text did not come). Its prefill and frames overwrote the slot from
        column ``checkpoint.written_from`` on, so of the tokens cached then only those before
        it remain."""
        self.history[:] = checkpoint.history
        cached = checkpoint.cached_tokens
        self.cached_tokens = None if cached is None else cached[:, : checkpoint.written_from]

    def prefilled(self, prompt: torch.Tensor) -> None:
        """The slot now holds ``prompt``."""
        self.cached_tokens = prompt

    def completed(self, frames: torch.Tensor) -> None:
        """A segment generated ``frames`` [C+1, N] (prefill frame through the last one)."""
        assert self.cached_tokens is not None
        self.history.append(frames)
        # Every frame but the last was fed back, so its keys/values are in the slot.
        self.cached_tokens = torch.cat([self.cached_tokens, frames[:, :-1]], dim=1)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two token-column tensors [C+1, *]."""
    n = min(a.shape[1], b.shape[1])
    same = (a[:, :n] == b[:, :n]).all(dim=0)  # [n]
    mismatch = (~same).nonzero()
    return int(mismatch[0, 0]) if mismatch.numel() else n
