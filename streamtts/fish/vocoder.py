"""The vocoder thread: incremental Firefly decoding of every stream's new frames, batched.

Each stream keeps its decoder state for its whole life, so audio is continuous across text
segments (no seams, unlike upstream's per-chunk decode from a zero state). Work arrives as
code chunks from the generator thread; all chunks waiting at once are decoded in one batched
forward (several chunks of one stream are concatenated first).

On the CPU the worker runs *inline*: no thread of its own; the generator thread calls
:meth:`VocoderWorker.drain` after each iteration (see :mod:`streamtts.fish.devices` for why
the CPU gets one torch thread).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from streamtts.engine.base import PcmF32
from streamtts.fish.devices import DeviceContext
from streamtts.models.fish.codec.incremental import DecoderState, IncrementalDecoder

log = logging.getLogger(__name__)


@dataclass
class VocoderStream:
    """A stream's decoder memory and where its audio goes (callbacks must not block)."""

    state: DecoderState
    on_pcm: Callable[[PcmF32], None] = lambda pcm: None
    on_segment_end: Callable[[], None] = lambda: None
    on_error: Callable[[BaseException], None] = lambda exc: None
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class _Chunk:
    stream: VocoderStream
    codes: torch.Tensor  # [C, n] on the engine device
    final: bool  # last chunk of a segment
    ready: torch.cuda.Event | None


class VocoderWorker:
    def __init__(
        self,
        decoder: IncrementalDecoder,
        device: DeviceContext,
        on_fatal: Callable[[BaseException], None],
        inline: bool = False,
    ) -> None:
        self._decoder = decoder
        self._device = device
        self._on_fatal = on_fatal
        self.inline = inline
        self._stopped = False
        self._inbox: queue.SimpleQueue[_Chunk | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="vocoder", daemon=True)

    @property
    def decoder(self) -> IncrementalDecoder:
        return self._decoder

    def new_stream(self) -> VocoderStream:
        return VocoderStream(self._decoder.new_state())

    def start(self) -> None:
        if not self.inline:
            self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        if not self.inline:
            self._inbox.put(None)
            self._thread.join(timeout=10)

    def is_alive(self) -> bool:
        return not self._stopped if self.inline else self._thread.is_alive()

    def drain(self) -> None:
        """Inline mode: decode every chunk waiting now, on the calling (generator) thread."""
        chunks: list[_Chunk] = []
        self._take_waiting(chunks)  # inline, nothing puts the stop marker
        if chunks and not self._stopped:
            self._decode(chunks)

    def submit(self, stream: VocoderStream, codes: torch.Tensor, final: bool) -> None:
        """Called on the generator thread: ``codes`` [C, n] are ready after its current work."""
        self._inbox.put(_Chunk(stream, codes, final, self._device.record()))

    # ---- the thread ----

    def _main(self) -> None:
        try:
            with self._device.worker_stream("vocoder"), torch.inference_mode():
                while True:
                    chunks = self._take()
                    if chunks is None:
                        return
                    self._decode(chunks)
        except BaseException as exc:
            log.exception("vocoder thread died")
            self._on_fatal(exc)

    def _take(self) -> list[_Chunk] | None:
        """Block for one chunk, then take everything else already waiting."""
        first = self._inbox.get()
        if first is None:
            return None
        chunks = [first]
        if self._take_waiting(chunks):
            self._inbox.put(None)  # stop after this batch
        return chunks

    def _take_waiting(self, chunks: list[_Chunk]) -> bool:
        """Append the chunks waiting now, up to a stop marker; True if one was met."""
        while True:
            try:
                more = self._inbox.get_nowait()
            except queue.Empty:
                return False
            if more is None:
                return True
            chunks.append(more)

    def _decode(self, chunks: list[_Chunk]) -> None:
        grouped: dict[int, list[_Chunk]] = {}
        for chunk in chunks:
            if not chunk.stream.cancelled.is_set():
                self._device.wait(chunk.ready, chunk.codes)
                grouped.setdefault(id(chunk.stream), []).append(chunk)
        work = list(grouped.values())
        if not work:
            return
        try:
            pcm = self._decode_groups(work)
        except Exception:
            # States advance only after a successful forward, so each stream can be retried
            # alone: only a stream that fails by itself is failed.
            for group in work:
                try:
                    pcm = self._decode_groups([group])
                except Exception as exc:
                    log.exception("vocoder failed for one stream")
                    group[0].stream.on_error(exc)
                    continue
                self._deliver(group, pcm[0])
            return
        for group, audio in zip(work, pcm, strict=True):
            self._deliver(group, audio)

    def _decode_groups(self, work: list[list[_Chunk]]) -> list[torch.Tensor]:
        return self._decoder.decode(
            [group[0].stream.state for group in work],
            [torch.cat([c.codes for c in group], dim=1) for group in work],
        )

    def _deliver(self, group: list[_Chunk], audio: torch.Tensor) -> None:
        stream = group[0].stream
        samples: PcmF32 = audio.cpu().numpy().astype(np.float32, copy=False)
        if samples.size:
            stream.on_pcm(samples)
        for _ in range(sum(c.final for c in group)):
            stream.on_segment_end()
