"""Voice prefixes: the part of every prompt of a voice that never changes, prefilled once.

A voice's prefix is the system message plus its reference turns (the transcript as a user turn,
the reference codes as the assistant's answer; spec §3.4). It is the same for every segment of
every stream of that voice, so its keys/values are computed once and copied into a stream's
KV slot when the stream starts. Upstream re-prefills it for every text chunk.

The default voice's prefix (the system message alone) is prefilled at start and kept. A cloned
voice's is computed the first time a stream uses it — as part of that stream's own (chunked)
prefill, so it never holds up other streams — and then kept, for at most ``capacity`` voices
(least recently used first out). Each kept prefix holds ``[layers, kv_heads, P, head_dim]`` keys
and values: 12 KiB per prefix token for Fish-Speech 1.5 in bf16 (24 in fp32), so a 10 s
reference (~250 tokens) takes about 3 MiB. Used on the generator thread only.

What is kept is the prefix and the opening of the turn that follows it (the user message's
header, :meth:`PromptBuilder.turn_opening`): a stream's first segment always begins with both,
so it prefills from its text on (the synthetic tokenizer's header is 5 tokens of the bench
sentence's 51; a real tokenizer's, 3). A later segment's turn follows the stream's history,
where the slot's own keys/values serve.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from streamtts.engine.base import ClonedVoice
from streamtts.models.fish.llm.llama import KVCache
from streamtts.models.fish.llm.prompt import PromptBuilder, Reference

DEFAULT_KEY = ""  # the default voice: no reference


@dataclass
class _Prefix:
    tokens: torch.Tensor  # [C+1, P] on the CPU
    held: torch.Tensor  # [C+1, P + h]: the prefix and a turn's opening, whose keys/values are kept
    keys: torch.Tensor | None = None  # [layers, G, P + h, Dh] on the model's device, once computed
    values: torch.Tensor | None = None


class VoicePrefixes:
    def __init__(self, prompts: PromptBuilder, capacity: int) -> None:
        self._prompts = prompts
        self._capacity = capacity
        self._entries: OrderedDict[str, _Prefix] = OrderedDict()
        self._entries[DEFAULT_KEY] = self._entry(prompts.prefix())

    def _entry(self, prefix: torch.Tensor) -> _Prefix:
        return _Prefix(prefix, torch.cat([prefix, self._prompts.turn_opening()], dim=1))

    @staticmethod
    def key(voice: ClonedVoice | None) -> str:
        return DEFAULT_KEY if voice is None else voice.key

    def tokens(self, voice: ClonedVoice | None) -> torch.Tensor:
        """The voice's prefix tokens [C+1, P] (built on first use)."""
        return self._get(voice).tokens

    def held_tokens(self, voice: ClonedVoice | None) -> torch.Tensor:
        """The columns whose keys/values are kept for the voice, once computed: its prefix and
        a turn's opening, [C+1, P + h] (built on first use)."""
        return self._get(voice).held

    def _get(self, voice: ClonedVoice | None) -> _Prefix:
        entry = self._entries.get(self.key(voice))
        if entry is None:
            assert voice is not None
            reference = Reference(voice.text, torch.from_numpy(voice.codes))
            entry = self._entry(self._prompts.prefix([reference]))
            self._entries[voice.key] = entry
            self._evict()
        self._entries.move_to_end(self.key(voice))
        return entry

    def kept_tokens(self, voice: ClonedVoice | None) -> torch.Tensor | None:
        """:meth:`held_tokens` once their keys/values are kept, else None."""
        entry = self._entries.get(self.key(voice))
        return None if entry is None or entry.keys is None else entry.held

    def copy_into(self, voice: ClonedVoice | None, cache: KVCache, slot: int) -> None:
        """Write the voice's cached keys/values into positions [0, P + h) of ``slot``."""
        entry = self._entries[self.key(voice)]
        assert entry.keys is not None and entry.values is not None
        length = entry.keys.shape[2]
        cache.k[:, slot, :, :length] = entry.keys
        cache.v[:, slot, :, :length] = entry.values

    def keep(self, voice: ClonedVoice | None, cache: KVCache, slot: int) -> None:
        """``slot`` holds the voice's :meth:`held_tokens` at positions [0, P + h): keep a copy
        of their keys/values."""
        entry = self._entries.get(self.key(voice))
        if entry is None:  # forgotten meanwhile (deleted, or evicted)
            return
        length = entry.held.shape[1]
        entry.keys = cache.k[:, slot, :, :length].clone()
        entry.values = cache.v[:, slot, :, :length].clone()

    def forget(self, voice_id: str) -> None:
        """Drop every prefix of ``voice_id`` (it was deleted)."""
        for key in [k for k in self._entries if k.split(":", 1)[0] == voice_id and k]:
            del self._entries[key]

    def _evict(self) -> None:
        while len(self._entries) > self._capacity + 1:  # + the default voice, always kept
            oldest = next(k for k in self._entries if k != DEFAULT_KEY)
            del self._entries[oldest]

    @property
    def kept(self) -> int:
        """Cloned voices whose keys/values are kept now."""
        return sum(e.keys is not None for k, e in self._entries.items() if k != DEFAULT_KEY)
