"""The vocoder thread: incremental Firefly decoding of every stream's new frames, batched.

Each stream keeps its decoder state for its whole life, so audio is continuous across text
segments (no seams, unlike upstream's per-chunk decode from a zero state). The state is made on
this thread at the stream's first chunk, never on the event loop. Work arrives as code chunks
from the generator thread; all chunks waiting at once are decoded in one batched forward
(several chunks of one stream are concatenated first).

On the CPU the worker runs *inline*: no thread of its own; the generator thread calls
:meth:`VocoderWorker.drain` after each iteration (see :mod:`streamtts.fish.devices` for why
the CPU gets one torch thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from streamtts.engine.base import PcmF32
from streamtts.engine.worker import OnFatal, Worker, each_alone
from streamtts.fish.devices import DeviceContext
from streamtts.models.fish.codec.incremental import DecoderState, IncrementalDecoder

log = logging.getLogger(__name__)


@dataclass
class VocoderStream:
    """A stream's decoder memory and where its audio goes (callbacks must not block).

    ``cancelled`` is the stream's one cancel token, shared with its generator slot."""

    cancelled: threading.Event
    state: DecoderState | None = None  # made on the vocoder's thread at the first chunk
    on_pcm: Callable[[PcmF32], None] = lambda pcm: None
    on_segment_end: Callable[[], None] = lambda: None
    on_error: Callable[[BaseException], None] = lambda exc: None


@dataclass(frozen=True)
class _Chunk:
    stream: VocoderStream
    codes: torch.Tensor  # [C, n] on the engine device
    final: bool  # last chunk of a segment
    ready: torch.cuda.Event | None


@dataclass
class _Group:
    """The chunks of one stream decoded together."""

    stream: VocoderStream
    chunks: list[_Chunk] = field(default_factory=list)


class VocoderWorker(Worker[_Chunk]):
    def __init__(
        self,
        decoder: IncrementalDecoder,
        device: DeviceContext,
        on_fatal: OnFatal,
        inline: bool = False,
    ) -> None:
        super().__init__("vocoder", on_fatal, inline=inline)
        self._decoder = decoder
        self._device = device

    @property
    def decoder(self) -> IncrementalDecoder:
        return self._decoder

    def submit(self, stream: VocoderStream, codes: torch.Tensor, final: bool) -> None:
        """Called on the generator thread: ``codes`` [C, n] are ready after its current work."""
        self.post(_Chunk(stream, codes, final, self._device.record()))

    def drain(self) -> None:
        """Inline mode: decode every chunk waiting now, on the calling (generator) thread."""
        chunks = self.take(block=False)
        if chunks and self.is_alive():
            self._decode(chunks)

    # ---- the thread ----

    def run(self) -> None:
        with self._device.worker_stream("vocoder"), torch.inference_mode():
            while (chunks := self.take(block=True)) is not None:
                self._decode(chunks)

    def _decode(self, chunks: list[_Chunk]) -> None:
        groups: dict[int, _Group] = {}
        for chunk in chunks:
            if not chunk.stream.cancelled.is_set():
                self._device.wait(chunk.ready, chunk.codes)
                groups.setdefault(id(chunk.stream), _Group(chunk.stream)).chunks.append(chunk)
        if groups:
            each_alone(list(groups.values()), self._decode_groups, self._fail)

    def _decode_groups(self, groups: Sequence[_Group]) -> None:
        """One batched forward; states advance only if it succeeds, so a failed batch can be
        retried a stream at a time."""
        for group in groups:
            if group.stream.state is None:
                group.stream.state = self._decoder.new_state()
        pcm = self._decoder.decode(
            [g.stream.state for g in groups if g.stream.state is not None],
            [torch.cat([c.codes for c in g.chunks], dim=1) for g in groups],
        )
        for group, audio in zip(groups, pcm, strict=True):
            self._deliver(group, audio)

    def _deliver(self, group: _Group, audio: torch.Tensor) -> None:
        stream = group.stream
        try:
            samples: PcmF32 = audio.cpu().numpy().astype(np.float32, copy=False)
            if samples.size:
                stream.on_pcm(samples)
            for _ in range(sum(c.final for c in group.chunks)):
                stream.on_segment_end()
        except Exception as exc:  # the audio was decoded: failing it must not redo the batch
            self._fail(group, exc)

    @staticmethod
    def _fail(group: _Group, exc: BaseException) -> None:
        group.stream.on_error(exc)
