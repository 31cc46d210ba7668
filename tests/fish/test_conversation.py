"""A stream's iterative prompt: what its slot holds, what a new segment prefills."""

from __future__ import annotations

import dataclasses

import torch

from streamtts.fish.conversation import MIN_FRAMES_ROOM, Conversation, Plan, common_prefix

ROWS = 9


def tokens(*ids: int) -> torch.Tensor:
    t = torch.zeros(ROWS, len(ids), dtype=torch.int32)
    t[0] = torch.tensor(ids, dtype=torch.int32)
    return t


def test_the_first_segment_copies_what_the_voice_keeps_and_prefills_the_rest() -> None:
    conversation = Conversation()
    # The voice keeps its prefix and the opening every turn begins with (here 7).
    prefix, turn, kept = tokens(1, 2, 3), tokens(7, 10, 11), tokens(1, 2, 3, 7)
    plan = conversation.plan(prefix, turn, 4096, 1024, kept)
    assert plan.copy_prefix and not plan.keep_prefix and plan.prefill_from == 4
    assert torch.equal(plan.prompt, torch.cat([prefix, turn], dim=1))
    conversation.prefilled(plan.prompt)
    frames = tokens(20, 21, 22)  # prefill frame .. last frame
    conversation.completed(frames)
    assert conversation.history == [turn, frames]
    cached = conversation.cached_tokens
    assert cached is not None and cached.shape[1] == 6 + 2  # the last frame was not fed back


def test_a_voice_prefix_not_yet_cached_is_prefilled_with_the_first_turn_then_kept() -> None:
    conversation = Conversation()
    prefix, turn = tokens(1, 2, 3), tokens(10, 11)
    plan = conversation.plan(prefix, turn, 4096, 1024, None)
    assert not plan.copy_prefix and plan.keep_prefix and plan.prefill_from == 0
    conversation.prefilled(plan.prompt)
    conversation.completed(tokens(20, 21))
    later = conversation.plan(prefix, tokens(30), 4096, 1024, None)
    assert not later.copy_prefix and not later.keep_prefix  # only a stream's first segment


def one_segment_spoken() -> tuple[Conversation, torch.Tensor, Plan]:
    """A conversation after its first segment (prefix of 3, turn of 2, frames of 3); its
    prefix and that segment's plan."""
    conversation = Conversation()
    prefix = tokens(1, 2, 3)
    first = conversation.plan(prefix, tokens(10, 11), 4096, 1024, prefix)
    conversation.prefilled(first.prompt)
    conversation.completed(tokens(20, 21, 22))
    return conversation, prefix, first


def test_a_later_segment_prefills_only_what_its_prompt_adds() -> None:
    conversation, prefix, _ = one_segment_spoken()
    second = conversation.plan(prefix, tokens(30, 31), 4096, 1024, prefix)
    assert not second.copy_prefix
    # prefix + turn0 + frames0 (3) + turn1: the slot holds prefix + turn0 + 2 frames.
    assert second.prompt.shape[1] == 3 + 2 + 3 + 2
    assert second.prefill_from == 3 + 2 + 2


def test_a_history_that_cannot_fit_starts_afresh() -> None:
    conversation = Conversation()
    prefix = tokens(1, 2)
    long_turn = tokens(*range(100, 100 + 40))
    plan = conversation.plan(prefix, long_turn, 4096, 40 + MIN_FRAMES_ROOM, prefix)
    assert plan.prompt.shape[1] == 2 + 40 and conversation.history == [long_turn]


def test_common_prefix() -> None:
    a, b = tokens(1, 2, 3, 4), tokens(1, 2, 9)
    assert common_prefix(a, b) == 2 and common_prefix(a, a) == 4 and common_prefix(a, a[:, :0]) == 0


def test_a_dropped_segment_is_rewound_to_what_the_slot_still_holds() -> None:
    conversation, prefix, first = one_segment_spoken()
    history, before = list(conversation.history), conversation.cached_tokens
    dropped = conversation.plan(prefix, tokens(30, 31), 4096, 1024, prefix)
    assert dropped.undo.written_from == dropped.prefill_from
    conversation.prefilled(dropped.prompt)
    conversation.completed(tokens(40, 41))
    conversation.rewind(dropped.undo)
    assert conversation.history == history
    cached = conversation.cached_tokens
    assert cached is not None and before is not None and torch.equal(cached, before)  # all kept
    again = conversation.plan(prefix, tokens(50), 4096, 1024, prefix)
    assert again.prefill_from == 3 + 2 + 2  # as if the dropped segment had never been planned
    # Where the dropped prompt rewrote the slot from an earlier column, only what precedes
    # that column is still cached.
    conversation.rewind(dataclasses.replace(dropped.undo, written_from=4))
    cached = conversation.cached_tokens
    assert cached is not None and torch.equal(cached, first.prompt[:, :4])


def test_a_dropped_first_segment_leaves_nothing_cached() -> None:
    conversation = Conversation()
    plan = conversation.plan(tokens(1, 2, 3), tokens(10, 11), 4096, 1024, tokens(1, 2, 3))
    conversation.prefilled(plan.prompt)
    conversation.rewind(plan.undo)
    assert conversation.cached_tokens is None and conversation.history == []
    assert conversation.plan(tokens(1, 2, 3), tokens(12), 4096, 1024, tokens(1, 2, 3)).copy_prefix
