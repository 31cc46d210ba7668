"""What the generator and vocoder threads share: streams, segment jobs and the chunk schedule.

A :class:`StreamSlot` lives as long as an engine stream: it owns one KV-cache slot, the tokens
whose keys/values are in that slot, and the iterative-prompt history. A :class:`SegmentJob` is
one text segment of that stream moving through prefill and decode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from streamtts.models.fish.llm.sampling import SamplingParams

FRAME_SAMPLES = 2048  # audio samples per semantic frame at 44.1 kHz
FRAME_S = FRAME_SAMPLES / 44_100


@dataclass(frozen=True)
class ChunkSchedule:
    """First audio after ``first_frames`` frames, then chunks of ``later_frames``."""

    first_frames: int = 4
    later_frames: int = 8

    def due(self, emitted_frames: int, pending_frames: int) -> bool:
        need = self.first_frames if emitted_frames == 0 else self.later_frames
        return pending_frames >= need


@dataclass
class StreamSlot:
    """Engine-side state of one stream (guarded by the generator thread)."""

    slot: int
    # Token columns [C+1, P] whose keys/values sit in positions 0..P-1 of the slot.
    cached_tokens: torch.Tensor
    # Iterative-prompt history: turn, frames, turn, frames, ... (each [C+1, n], on the CPU).
    history: list[torch.Tensor] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Frames handed to the vocoder since the stream began, and when the first one was.
    emitted_frames: int = 0
    first_emit_s: float | None = None

    def audio_lead_s(self, now_s: float) -> float:
        """How far the audio made so far runs ahead of real-time playback."""
        if self.first_emit_s is None:
            return 0.0
        return self.emitted_frames * FRAME_S - (now_s - self.first_emit_s)


class Phase(Enum):
    PREFILL = "prefill"
    DECODE = "decode"


# Callbacks run on the generator thread and must not block.
OnCodes = Callable[[torch.Tensor, bool], None]  # codes [C, n] (device), final chunk of segment
OnError = Callable[[BaseException], None]


@dataclass
class SegmentJob:
    stream: StreamSlot
    text: str
    params: SamplingParams
    max_frames: int
    stop_on_im_end: bool
    schedule: ChunkSchedule
    on_codes: OnCodes
    on_error: OnError
    submitted_s: float = field(default_factory=time.perf_counter)
    phase: Phase = Phase.PREFILL
    prompt: torch.Tensor | None = None  # [C+1, L], built on the generator thread (CPU)
    prefill_pos: int = 0  # next prompt column to prefill
    frames: list[torch.Tensor] = field(default_factory=list)  # generated [C+1] columns (device)
    sent_frames: int = 0  # of ``frames[1:]`` already handed to the vocoder
    finished: bool = False
