"""What the Fish engine's threads share about a stream: its slot, cancel token and pacing, and
each text segment's job moving through prefill and decode.

A :class:`StreamSlot` lives as long as an engine stream: one KV-cache slot, the stream's
conversation (iterative-prompt history and cached tokens), its random generator when seeded,
its one cancel token, and how far its audio runs ahead of real time. A :class:`SegmentJob` is one
text segment of that stream. Built on the event loop without torch; the generator thread fills
in the tensors.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from streamtts.engine.base import ClonedVoice
from streamtts.fish.conversation import Checkpoint, Conversation
from streamtts.models.fish.llm.sampling import SamplingParams
from streamtts.scheduling import PlaybackClock

# A stream made at this share of real time or more, and less than 1, starts with 2 frames.
NEAR_REALTIME = 0.8


@dataclass(frozen=True)
class ChunkSchedule:
    """First audio after ``first_frames`` frames; later chunks ramp up to ``later_frames``, and
    go early whenever the listener would otherwise run dry.

    The ramp: a later chunk is at most as long as the audio already handed over (2, 2, 4, 8,
    8, ... for 2 and 8): fewer, longer chunks while generation runs well ahead of real time.
    The ramp alone starves a stream made between 0.57x and 1x real time (waiting for frames
    9-16, the listener has only 8 frames' audio), so a later chunk is also due, with at least
    ``first_frames`` pending, once the listener's lead is shorter than the time until the next
    chance to hand frames over. Not once the listener has run dry, though: then the frames wait
    for the ramp's chunk, as a vocoder call has a fixed cost (on the dev CPU 9 ms a call and
    4 ms a frame), so short chunks would keep a barely real-time stream from catching up.
    """

    first_frames: int
    later_frames: int
    # Whether chunks may go early by the listener's lead. Off for a seeded stream, whose audio
    # must not depend on timing: the vocoder's fp32 roundings depend on chunk lengths (~1e-7).
    early: bool = True

    @staticmethod
    def auto_first_frames(realtime_factor: float | None) -> int:
        """The first chunk for a stream made at ``realtime_factor`` (compute seconds per audio
        second; None: not measured yet): 1 frame, or 2 from :data:`NEAR_REALTIME` up to real
        time, where a one-frame start leaves too little lead to grow the chunks past the
        vocoder's fixed cost without the listener waiting (tests/fish/test_jobs.py)."""
        if realtime_factor is not None and NEAR_REALTIME <= realtime_factor < 1:
            return 2
        return 1

    def frames_due(self, emitted_frames: int) -> int:
        """Frames the next chunk needs after ``emitted_frames`` were handed over, by the ramp."""
        if emitted_frames == 0:
            return self.first_frames
        return min(self.later_frames, max(self.first_frames, emitted_frames))

    def due(
        self,
        emitted_frames: int,
        pending_frames: int,
        lead_s: float = math.inf,
        next_chance_s: float = 0.0,
    ) -> bool:
        """Whether to hand over the ``pending_frames`` now. ``lead_s``: audio handed over and
        not yet heard; ``next_chance_s``: how long until frames can be handed over again."""
        if pending_frames >= self.frames_due(emitted_frames):
            return True
        early = self.early and emitted_frames > 0 and pending_frames >= self.first_frames
        return early and 0 < lead_s < next_chance_s


@dataclass
class StreamSlot:
    """Engine-side state of one stream (mutated on the generator thread only, but ``cancelled``,
    which anyone may set)."""

    slot: int
    frame_s: float  # seconds of audio per frame (the vocoder's geometry)
    voice: ClonedVoice | None = None  # None: the model's default voice
    conversation: Conversation = field(default_factory=Conversation)
    # The stream's one cancel token: the generator drops its jobs, the vocoder its chunks.
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Its own random generator, made on the generator thread at its first segment when seeded.
    rng: torch.Generator | None = None
    # Its audio as the vocoder is handed it (frames x frame_s): its deadline (scheduling).
    clock: PlaybackClock = field(default_factory=PlaybackClock)


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
    keep_prefix: bool = False  # keep the voice prefix's keys/values once prefilled
    frames: list[torch.Tensor] = field(default_factory=list)  # generated [C+1] columns (device)
    sent_frames: int = 0  # of ``frames[1:]`` already handed to the vocoder
    finished: bool = False
    # Prepared ahead of its segment's confirmation (EngineStream.prepare): its frames wait for
    # confirm, or are dropped and the conversation rewound to ``undo`` (its plan's).
    held: bool = False
    dropped: bool = False  # (or failed) nothing more of it goes to the vocoder
    undo: Checkpoint | None = None

    @property
    def parked(self) -> bool:
        """Held with its first chunk's frames made: it waits for its text to be confirmed
        rather than decode audio that may never be heard."""
        return self.held and len(self.frames) - 1 >= self.schedule.first_frames

    @property
    def decoding(self) -> bool:
        return self.phase is Phase.DECODE

    @property
    def prompt_len(self) -> int:
        assert self.prompt is not None
        return int(self.prompt.shape[1])
