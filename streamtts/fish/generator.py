"""The generator thread: continuous batching of semantic-frame generation over all live streams.

Each iteration: take commands (new segments, cancels, releases) → prefill at most one chunk of
the oldest waiting prompt → one decode step for every decoding segment at once (each at its
own position in its own KV slot, with its own sampling parameters) → hand finished frames to
the vocoder by the chunk schedule. Streams keep their KV slot between segments, so a new
segment only prefills what its prompt adds to the cached tokens (the previous segment's frames
and the new user turn); the shared system prompt is prefilled once into a reserved slot and
copied.

All torch work of the LLM happens on this thread (on its own CUDA stream when on a GPU).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from streamtts.fish.compiled import CompiledFastCodes, compile_slow_step, compiles_slow_step
from streamtts.fish.devices import DeviceContext, fulfil
from streamtts.fish.jobs import Phase, SegmentJob, StreamSlot
from streamtts.models.fish.llm.generate import (
    FastCodes,
    RepetitionWindows,
    SlowStep,
    decode_step,
    fast_codes,
    prefill_frame,
    slow_step,
)
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache
from streamtts.models.fish.llm.prompt import PromptBuilder, segment_prompt
from streamtts.models.fish.llm.sampling import BatchSampling

log = logging.getLogger(__name__)


# Positions a segment's prompt must leave free in the cache for its frames.
MIN_FRAMES_ROOM = 64


@dataclass(frozen=True)
class GeneratorConfig:
    prefill_chunk_tokens: int = 128
    # History budget of the iterative prompt (upstream's server uses 4096).
    max_prompt_tokens: int = 4096
    # A stream whose audio runs this far ahead of real time sits out decode steps while others
    # need compute.
    max_lead_s: float = 6.0
    # torch.compile the decode step at start (see streamtts.fish.compiled).
    compile: bool = False


@dataclass(frozen=True)
class _Submit:
    job: SegmentJob


@dataclass(frozen=True)
class _Release:
    stream: StreamSlot


@dataclass(frozen=True)
class _Wake:
    pass


@dataclass(frozen=True)
class _Stop:
    pass


@dataclass(frozen=True)
class _Call:
    fn: Callable[[], object]
    future: Future[object]  # gets fn's result or error; the generator carries on either way


_Command = _Submit | _Release | _Wake | _Stop | _Call


class GeneratorWorker:
    def __init__(
        self,
        model: DualARTransformer,
        cache: KVCache,
        prompts: PromptBuilder,
        im_end_id: int,
        device: DeviceContext,
        config: GeneratorConfig,
        on_fatal: Callable[[BaseException], None],
        after_iteration: Callable[[], None] = lambda: None,
    ) -> None:
        self._model = model
        self._cache = cache
        self._prompts = prompts
        self._im_end_id = im_end_id
        self._device = device
        self._config = config
        self._on_fatal = on_fatal
        self._after_iteration = after_iteration  # e.g. the inline vocoder's drain
        self._prefix_slot = cache.slots - 1  # reserved for the shared system prompt
        self._prefix_tokens = prompts.prefix()  # [C+1, P0]
        self._free_slots = list(range(cache.slots - 1))
        self._slots_lock = threading.Lock()
        self._windows = RepetitionWindows(cache.slots, model.config.num_codebooks + 1, model.device)
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._jobs: list[SegmentJob] = []
        self._thread = threading.Thread(target=self._main, name="generator", daemon=True)
        self._fast: FastCodes = fast_codes
        self._slow: SlowStep = slow_step
        self.compile_s: dict[str, float] = {}  # seconds per compiled graph
        # Test seam: called with each job before its work in an iteration; may raise.
        self.before_job_work: Callable[[SegmentJob], None] | None = None

    # ---- called from any thread ----

    @property
    def model(self) -> DualARTransformer:
        return self._model

    @property
    def fast_codes(self) -> FastCodes:
        """The codebook pass decode steps use: eager, or compiled per batch bucket."""
        return self._fast

    @property
    def slow_step(self) -> SlowStep:
        """The slow transformer's step decode steps use: eager, or compiled."""
        return self._slow

    @property
    def capacity(self) -> int:
        return self._cache.slots - 1

    @property
    def free_slots(self) -> int:
        with self._slots_lock:
            return len(self._free_slots)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._inbox.put(_Stop())
        self._thread.join(timeout=10)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def acquire(self) -> StreamSlot | None:
        """A slot for a new stream, or None when all are taken."""
        with self._slots_lock:
            if not self._free_slots:
                return None
            slot = self._free_slots.pop()
        return StreamSlot(slot, self._prefix_tokens[:, :0])

    def submit(self, job: SegmentJob) -> None:
        self._inbox.put(_Submit(job))

    def wake(self) -> None:
        self._inbox.put(_Wake())

    def call(self, fn: Callable[[], object]) -> Future[object]:
        """Run ``fn`` on the generator thread between iterations (benchmarks measure there)."""
        future: Future[object] = Future()
        self._inbox.put(_Call(fn, future))
        return future

    def release(self, stream: StreamSlot) -> None:
        """The stream is closed: its slot is free at once, its work dropped.

        Safe to reuse the slot immediately: the cancelled stream's jobs are skipped from the
        next iteration on, and the worker takes this release before any job submitted later,
        which re-prefills the slot from the shared prefix anyway.
        """
        stream.cancelled.set()
        self._inbox.put(_Release(stream))
        with self._slots_lock:
            self._free_slots.append(stream.slot)

    # ---- the thread ----

    def _main(self) -> None:
        try:
            with self._device.worker_stream("generator"), torch.inference_mode():
                if self._config.compile:
                    self._compile()
                self._prefill_prefix()
                while self._take_commands():
                    self._iterate()
                    self._after_iteration()
        except BaseException as exc:  # the worker is dead: say so loudly, fail everything
            log.exception("generator thread died")
            for job in self._jobs:
                job.on_error(exc)
            self._on_fatal(exc)

    def _compile(self) -> None:
        fast = CompiledFastCodes(self.capacity, self._model.device)
        fast.warm_up(self._model, self._cache)
        self.compile_s = dict(fast.compile_s)
        self._fast = fast
        if compiles_slow_step(self._model):
            self._slow, slow_s = compile_slow_step(self._model, self._cache, self.capacity)
            self.compile_s.update(slow_s)

    def _prefill_prefix(self) -> None:
        prefix = self._prefix_tokens.to(self._model.device)
        self._model.prefill(self._cache, prefix, self._prefix_slot, 0)

    def _take_commands(self) -> bool:
        """Apply queued commands; block while idle. False when asked to stop."""
        block = not self._jobs
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(command, _Stop):
                return False
            if isinstance(command, _Submit):
                self._jobs.append(command.job)
            elif isinstance(command, _Release):
                self._drop_stream(command.stream)
            elif isinstance(command, _Call):
                fulfil(command.future, command.fn)

    def _drop_stream(self, stream: StreamSlot) -> None:
        self._jobs = [j for j in self._jobs if j.stream is not stream]

    def _iterate(self) -> None:
        self._jobs = [j for j in self._jobs if not j.stream.cancelled.is_set()]
        waiting = [j for j in self._jobs if j.phase is Phase.PREFILL]
        if waiting:
            self._guarded(waiting[0], self._prefill_chunk)
        self._decode(self._decode_batch(bool(waiting)))
        self._jobs = [j for j in self._jobs if not j.finished]

    def _guarded(self, job: SegmentJob, work: Callable[[SegmentJob], None]) -> None:
        """Run one job's work; an exception fails that job only."""
        try:
            if self.before_job_work is not None:
                self.before_job_work(job)
            work(job)
        except Exception as exc:
            log.exception("segment failed")
            job.finished = True
            job.on_error(exc)

    # ---- prefill ----

    def _prefill_chunk(self, job: SegmentJob) -> None:
        stream = job.stream
        if job.prompt is None:
            self._plan(job)
        assert job.prompt is not None
        total = job.prompt.shape[1]
        end = min(job.prefill_pos + self._config.prefill_chunk_tokens, total)
        chunk = job.prompt[:, job.prefill_pos : end].to(self._model.device)  # [C+1, S]
        if end < total:
            self._model.prefill(self._cache, chunk, stream.slot, job.prefill_pos)
            job.prefill_pos = end
            return
        sampling = BatchSampling.from_params([job.params], self._model.device)
        first = prefill_frame(
            self._model, self._cache, chunk, stream.slot, sampling, job.prefill_pos
        )
        stream.cached_tokens = job.prompt
        self._windows.reset(stream.slot)
        job.prefill_pos = total
        job.frames.append(first)
        job.phase = Phase.DECODE
        self._after_frames([job], [int(first[0])])

    def _plan(self, job: SegmentJob) -> None:
        """Build the segment's prompt and decide how much of it the slot already holds."""
        stream = job.stream
        if stream.cached_tokens.shape[1] == 0:
            length = self._prefix_tokens.shape[1]
            self._cache.copy_prefix(self._prefix_slot, stream.slot, length)
            stream.cached_tokens = self._prefix_tokens
        turn = self._prompts.turn(job.text)
        stream.history.append(turn)
        prompt = segment_prompt(self._prefix_tokens, stream.history, self._config.max_prompt_tokens)
        if prompt.shape[1] + MIN_FRAMES_ROOM > self._cache.max_seq_len:
            # Upstream's trimming rule keeps the whole history when even the newest entry
            # exceeds its budget (a context shorter than its 1024-frame reserve); that prompt
            # would not fit the cache, so the segment starts afresh from the prefix instead.
            log.warning("history does not fit %d cached tokens: dropped", self._cache.max_seq_len)
            stream.history[:] = [turn]
            prompt = torch.cat([self._prefix_tokens, turn], dim=1)
        job.prompt = prompt
        # At least the last column is prefilled: its logits start the segment.
        job.prefill_pos = min(_common_prefix(stream.cached_tokens, prompt), prompt.shape[1] - 1)

    # ---- decode ----

    def _decode_batch(self, prefill_waiting: bool) -> list[SegmentJob]:
        """The decoding jobs, less those far ahead of real time when others need compute."""
        decoding = [j for j in self._jobs if j.phase is Phase.DECODE and not j.finished]
        now_s = time.perf_counter()
        behind = [j for j in decoding if j.stream.audio_lead_s(now_s) < self._config.max_lead_s]
        others_need_compute = bool(behind) or prefill_waiting
        return behind if others_need_compute else decoding

    def _decode(self, batch: list[SegmentJob]) -> None:
        if not batch:
            return
        try:
            for job in batch:
                if self.before_job_work is not None:
                    self.before_job_work(job)
            tokens = self._decode_step(batch)
        except Exception:
            if len(batch) == 1:
                self._guarded(batch[0], lambda job: self._decode_one(job))
                return
            # Find the culprit: run each job alone; only a failing one is dropped.
            for job in batch:
                self._guarded(job, lambda job: self._decode_one(job))
            return
        self._after_frames(batch, tokens)

    def _decode_one(self, job: SegmentJob) -> None:
        self._after_frames([job], self._decode_step([job]))

    def _decode_step(self, batch: list[SegmentJob]) -> list[int]:
        device = self._model.device
        prompt_lens = [_prompt_len(j) for j in batch]
        steps = [len(j.frames) - 1 for j in batch]  # loop step index of the frame to make
        positions = [p + s for p, s in zip(prompt_lens, steps, strict=True)]
        slots = torch.tensor([j.stream.slot for j in batch], device=device)  # [B]
        pos = torch.tensor(positions, device=device)  # [B]
        frames_in = torch.stack([j.frames[-1] for j in batch])  # [B, C+1]
        sampling = BatchSampling.from_params([j.params for j in batch], device)
        new = decode_step(
            self._model,
            self._cache,
            frames_in,
            slots,
            pos,
            max(positions) + 1,
            self._windows.gather(slots),
            sampling,
            fast=self._fast,
            slow=self._slow,
        )  # [B, C+1]
        self._windows.push(slots, torch.tensor(steps, device=device), new)
        for job, frame in zip(batch, new, strict=True):
            job.frames.append(frame)
        return new[:, 0].tolist()  # the one host sync per step: stop checks need the tokens

    # ---- hand-off ----

    def _after_frames(self, jobs: list[SegmentJob], tokens: list[int]) -> None:
        for job, token in zip(jobs, tokens, strict=True):
            position = _prompt_len(job) + len(job.frames)
            job.finished = (
                (job.stop_on_im_end and token == self._im_end_id)
                or len(job.frames) >= job.max_frames
                or position >= self._cache.max_seq_len
            )
            self._guarded(job, self._emit)
            if job.finished:
                self._complete(job)

    def _emit(self, job: SegmentJob) -> None:
        """Hand frames to the vocoder per the chunk schedule (all of them once finished).

        Like upstream, the prefill frame is not vocoded and the final ``<|im_end|>`` frame is.
        """
        pending = len(job.frames) - 1 - job.sent_frames
        if not job.finished and not job.schedule.due(job.sent_frames, pending):
            return
        start = 1 + job.sent_frames
        if pending > 0:
            codes = torch.stack(job.frames[start : start + pending], dim=1)[1:]  # [C, n]
        else:
            codes = job.frames[0].new_zeros(self._model.config.num_codebooks, 0)
        job.sent_frames += pending
        stream = job.stream
        if stream.first_emit_s is None and pending > 0:
            stream.first_emit_s = time.perf_counter()
        stream.emitted_frames += pending
        job.on_codes(codes, job.finished)

    def _complete(self, job: SegmentJob) -> None:
        """Record the segment in the stream's history and cached tokens."""
        stream = job.stream
        frames = torch.stack(job.frames, dim=1).cpu()  # [C+1, N]
        stream.history.append(frames)
        # Every frame but the last was fed back, so its keys/values are in the slot.
        stream.cached_tokens = torch.cat([stream.cached_tokens, frames[:, :-1]], dim=1)


def _prompt_len(job: SegmentJob) -> int:
    assert job.prompt is not None
    return int(job.prompt.shape[1])


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two token-column tensors [C+1, *]."""
    n = min(a.shape[1], b.shape[1])
    same = (a[:, :n] == b[:, :n]).all(dim=0)  # [n]
    mismatch = (~same).nonzero()
    return int(mismatch[0, 0]) if mismatch.numel() else n
