"""The generator thread: continuous batching of semantic-frame generation over all live streams.

Each iteration: take commands (new segments, releases, calls) → prefill at most one chunk of a
waiting prompt → one decode step for a batch of the decoding segments at once (each at its own
position in its own KV slot, with its own sampling parameters and random generator) → hand
finished frames to the vocoder by the chunk schedule. Which prompt and which batch is the
:class:`~streamtts.fish.scheduler.Scheduler`'s choice. Streams keep their KV slot between
segments, so a new segment only prefills what its prompt adds to the cached tokens (see
:mod:`streamtts.fish.conversation`); a voice's prefix (system prompt and reference turns) is
prefilled once, kept (see :mod:`streamtts.fish.prefixes`) and copied.

All torch work of the LLM happens on this thread (on its own CUDA stream when on a GPU).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from streamtts.engine.base import ClonedVoice
from streamtts.engine.worker import OnFatal, Worker, each_alone
from streamtts.fish.compiled import (
    CompiledFastCodes,
    compile_slow_step,
    compiles_slow_step,
)
from streamtts.fish.devices import DeviceContext, fulfil
from streamtts.fish.jobs import Phase, SegmentJob, StreamSlot
from streamtts.fish.prefixes import VoicePrefixes
from streamtts.fish.scheduler import Scheduler
from streamtts.fish.settings import FishSettings
from streamtts.fish.slots import SlotPool
from streamtts.models.fish.fused import PYTHON_OPS, DecodeOps, fused_decode_for
from streamtts.models.fish.llm.generate import (
    FastCodes,
    Prefill,
    RepetitionWindows,
    SlowStep,
    decode_step,
    fast_codes,
    prefill_frame,
    slow_prefill,
    slow_step,
)
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.sampling import BatchSampling
from streamtts.models.fish.packed import is_packed
from streamtts.scheduling import CostModel, RunningMean, SchedulingSettings

log = logging.getLogger(__name__)

JobHook = Callable[[SegmentJob], None]

# A later chunk goes early once a listener's lead is shorter than this many iterations (the
# next chance to hand frames over comes an iteration later; the other one is margin for a
# slower iteration, such as one that also prefills).
NEXT_CHANCE_ITERATIONS = 2
# Whether streams without a seed draw upstream's values (sampling.draw_noise): they need not,
# and the faster draws save ~1.65 ms a frame per stream on the dev CPU. Seeded ones always do.
UPSTREAM_DRAWS = False


@dataclass(frozen=True)
class _Submit:
    job: SegmentJob


@dataclass(frozen=True)
class _Confirm:
    job: SegmentJob


@dataclass(frozen=True)
class _Drop:
    job: SegmentJob


@dataclass(frozen=True)
class _Release:
    stream: StreamSlot


@dataclass(frozen=True)
class _Forget:
    voice_id: str


@dataclass(frozen=True)
class _Call:
    fn: Callable[[], object]
    future: Future[object]  # gets fn's result or error; the generator carries on either way


_Command = _Submit | _Confirm | _Drop | _Release | _Forget | _Call


class GeneratorWorker(Worker[_Command]):
    def __init__(
        self,
        model: DualARTransformer,
        cache: KVCache,
        prompts: PromptBuilder,
        im_end_id: int,
        device: DeviceContext,
        settings: FishSettings,
        scheduling: SchedulingSettings,
        on_fatal: OnFatal,
        frame_s: float,
        after_iteration: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__("generator", on_fatal)
        self._model = model
        self._cache = cache
        self._prompts = prompts
        self._im_end_id = im_end_id
        self._device = device
        self._settings = settings
        self._after_iteration = after_iteration  # e.g. the inline vocoder's drain
        self._slots = SlotPool(cache.slots)
        self._scheduler = Scheduler(scheduling)
        self._frame_s = frame_s
        # What a decode iteration (and, on the CPU, the inline vocoder) costs per audio second
        # by batch size, and a prefill chunk: for the scheduler and for admission.
        self.cost = CostModel()
        self.cost_lock = threading.Lock()
        self._prefill_chunk_s = 0.0
        self._iteration_s = RunningMean()  # wall time of an iteration, vocoder included
        self._prefixes = VoicePrefixes(prompts, settings.max_cached_voices)
        self._windows = RepetitionWindows(cache.slots, model.config.num_codebooks + 1, model.device)
        self._jobs: list[SegmentJob] = []
        self._fast: FastCodes = fast_codes
        # The step's halves before any compile, and what runs each (models/fish/fused).
        self.decode_ops: DecodeOps = PYTHON_OPS
        self._slow: SlowStep = slow_step
        self._prefill: Prefill = slow_prefill
        self.compile_s: dict[str, float] = {}  # seconds per compiled graph
        self.eager_graphs: list[str] = []  # compiled, but measured no faster than eager
        # Test seam: called with each job before its work in an iteration; may raise.
        self.before_job_work: JobHook | None = None

    # ---- called from any thread ----

    @property
    def model(self) -> DualARTransformer:
        return self._model

    @property
    def fast(self) -> FastCodes:
        """The codebook pass decode steps use: the fused op or Python (eager), or compiled per
        batch bucket."""
        return self._fast

    @property
    def slow(self) -> SlowStep:
        """The slow transformer's step decode steps use: the fused op or Python, or compiled."""
        return self._slow

    @property
    def prefill(self) -> Prefill:
        """The slow transformer over a prompt: the fused op where the slow step is fused."""
        return self._prefill

    @property
    def capacity(self) -> int:
        return self._slots.capacity

    @property
    def free_slots(self) -> int:
        return self._slots.free

    def acquire(self, frame_s: float, voice: ClonedVoice | None = None) -> StreamSlot | None:
        """A slot for a new stream of ``voice`` (None: the default), or None when all are
        taken."""
        slot = self._slots.acquire()
        return None if slot is None else StreamSlot(slot, frame_s, voice)

    def forget_voice(self, voice_id: str) -> None:
        """Drop the cached prefix of a deleted voice (streams using it keep their own copy)."""
        self.post(_Forget(voice_id))

    def submit(self, job: SegmentJob) -> None:
        """Generate ``job``'s segment; a ``held`` job (prepared ahead of its text's
        confirmation) makes its prefill and its first chunk's frames, then waits for
        :meth:`confirm` or :meth:`drop`."""
        self.post(_Submit(job))

    def confirm(self, job: SegmentJob) -> None:
        """A held job's segment came: its frames go to the vocoder from now on."""
        self.post(_Confirm(job))

    def drop(self, job: SegmentJob) -> None:
        """A held job's segment did not come: its work stops and its stream's conversation is
        as if it had never been submitted."""
        self.post(_Drop(job))

    def call(self, fn: Callable[[], object]) -> Future[object]:
        """Run ``fn`` on the generator thread between iterations."""
        future: Future[object] = Future()
        self.post(_Call(fn, future))
        return future

    def release(self, stream: StreamSlot) -> None:
        """The stream is closed: its slot is free at once, its work dropped.

        Safe to reuse the slot immediately: the cancelled stream's jobs are skipped from the
        next iteration on, and the worker takes this release before any job submitted later,
        which re-prefills the slot from the shared prefix anyway.
        """
        stream.cancelled.set()
        self.post(_Release(stream))
        self._slots.release(stream.slot)

    # ---- the thread ----

    def run(self) -> None:
        with self._device.worker_stream("generator"), torch.inference_mode():
            self.decode_ops = fused_decode_for(self._model, self._settings.fused_ops)
            self._fast, self._slow = self.decode_ops.fast, self.decode_ops.slow
            self._prefill = self.decode_ops.prefill
            if self._settings.compile:
                self._compile()
            self._prefill_prefix()
            while (commands := self.take(block=self._idle())) is not None:
                for command in commands:
                    self._apply(command)
                started_s = time.perf_counter()
                batch, prefilled = self._iterate()
                self._after_iteration()
                iteration_s = time.perf_counter() - started_s
                self._iteration_s.observe(iteration_s, weight=0.2)
                if batch and not prefilled:  # a plain decode iteration: what a frame costs
                    with self.cost_lock:
                        self.cost.observe(iteration_s, self._frame_s, batch)

    def _idle(self) -> bool:
        """Nothing to do until a command comes (held jobs with their first chunk made wait)."""
        return all(job.parked for job in self._jobs)

    def fail_all(self, exc: BaseException) -> None:
        for job in self._jobs:
            job.on_error(exc)

    def _compile(self) -> None:
        model = self._model
        fast = CompiledFastCodes(
            self.capacity, model.device, timed=is_packed(model.fast_layers), eager=self._fast
        )
        fast.warm_up(model, self._cache)
        self.compile_s = dict(fast.compile_s)
        self.eager_graphs = [f"codebook_b{bucket}" for bucket in sorted(fast.eager)]
        if fast.compiled_buckets:
            self._fast = fast
        else:
            log.warning(
                "compile: the codebook pass stays eager: on this CPU its compiled graphs "
                "measured no faster than the packed eager pass (docs/operations.md, Choosing)"
            )
        if compiles_slow_step(model):
            self._slow, slow_s, slow_unused = compile_slow_step(
                model, self._cache, self.capacity, timed=is_packed(model.layers), eager=self._slow
            )
            self.compile_s.update(slow_s)
            self.eager_graphs += slow_unused

    def _prefill_prefix(self) -> None:
        """The default voice's prefix, prefilled through slot 0 (free until a stream takes it)."""
        held = self._prefixes.held_tokens(None).to(self._model.device)
        self._prefill(self._model, self._cache, held, 0, 0)
        self._prefixes.keep(None, self._cache, 0)

    def _apply(self, command: _Command) -> None:
        if isinstance(command, _Submit):
            self._jobs.append(command.job)
        elif isinstance(command, _Confirm):
            self._confirm(command.job)
        elif isinstance(command, _Drop):
            self._drop(command.job)
        elif isinstance(command, _Release):
            self._jobs = [j for j in self._jobs if j.stream is not command.stream]
        elif isinstance(command, _Forget):
            self._prefixes.forget(command.voice_id)
        else:
            fulfil(command.future, command.fn)

    def _confirm(self, job: SegmentJob) -> None:
        if job.dropped or job.stream.cancelled.is_set():
            return
        job.held = False
        if job.phase is Phase.DECODE:  # frames made while held go now (all, if it finished)
            self._guarded(job, self._emit)
            # On the CPU the vocoder runs inline after each iteration: run it now, or the first
            # audio would wait for another decode step.
            self._after_iteration()

    def _drop(self, job: SegmentJob) -> None:
        job.dropped = job.finished = True
        self._jobs = [j for j in self._jobs if j is not job]
        if job.undo is not None:  # planned: its prefill wrote the slot
            job.stream.conversation.rewind(job.undo)

    def _iterate(self) -> tuple[int, bool]:
        """One iteration; returns its decode batch size and whether it prefilled."""
        self._jobs = [j for j in self._jobs if not j.stream.cancelled.is_set()]
        now_s = time.perf_counter()
        chosen = self._scheduler.next_prefill(self._jobs, now_s, self._prefill_chunk_s)
        if chosen is not None:
            self._guarded(chosen, self._prefill_chunk)
            chunk_s = time.perf_counter() - now_s
            self._prefill_chunk_s = max(chunk_s, 0.8 * self._prefill_chunk_s + 0.2 * chunk_s)
        live = [j for j in self._jobs if not j.finished and not j.parked]
        waiting = any(not j.decoding for j in live)
        batch = self._scheduler.decode_batch(live, time.perf_counter(), waiting)
        if batch:
            each_alone(batch, self._decode, self._fail)
        self._jobs = [j for j in self._jobs if not j.finished]
        return len(batch), chosen is not None

    def _guarded(self, job: SegmentJob, work: Callable[[SegmentJob], None]) -> None:
        """Run one job's work; an exception fails that job only."""
        try:
            if self.before_job_work is not None:
                self.before_job_work(job)
            work(job)
        except Exception as exc:
            log.exception("segment failed")
            self._fail(job, exc)

    def _fail(self, job: SegmentJob, exc: BaseException) -> None:
        job.finished = job.dropped = True  # a held one's frames never go, even if confirmed
        job.on_error(exc)

    # ---- prefill ----

    def _prefill_chunk(self, job: SegmentJob) -> None:
        stream = job.stream
        if job.prompt is None:
            self._plan(job)
        assert job.prompt is not None
        total = job.prompt_len
        end = min(job.prefill_pos + self._settings.prefill_chunk_tokens, total)
        chunk = job.prompt[:, job.prefill_pos : end].to(self._model.device)  # [C+1, S]
        if end < total:
            self._prefill(self._model, self._cache, chunk, stream.slot, job.prefill_pos)
            job.prefill_pos = end
            return
        sampling = BatchSampling.from_params([job.params], self._model.device)
        first = prefill_frame(
            self._model,
            self._cache,
            chunk,
            stream.slot,
            sampling,
            job.prefill_pos,
            stream.rng,
            upstream_draws=UPSTREAM_DRAWS,
            fast=self._fast,  # the decode steps' pass: fused (or compiled) where they have it
            prefill=self._prefill,
        )
        stream.conversation.prefilled(job.prompt)
        if job.keep_prefix:
            self._prefixes.keep(stream.voice, self._cache, stream.slot)
        self._windows.reset(stream.slot)
        job.prefill_pos = total
        job.frames.append(first)
        job.phase = Phase.DECODE
        self._after_frames([job], [int(first[0])])

    def _plan(self, job: SegmentJob) -> None:
        """Build the segment's prompt and decide how much of it the slot already holds."""
        stream = job.stream
        if job.params.seed is not None and stream.rng is None:
            stream.rng = torch.Generator(self._model.device).manual_seed(job.params.seed)
        plan = stream.conversation.plan(
            self._prefixes.tokens(stream.voice),
            self._prompts.turn(job.text),
            self._cache.max_seq_len,
            self._cache.max_seq_len,
            self._prefixes.kept_tokens(stream.voice),
        )
        if plan.copy_prefix:
            self._prefixes.copy_into(stream.voice, self._cache, stream.slot)
        job.prompt = plan.prompt
        job.prefill_pos = plan.prefill_from
        job.keep_prefix = plan.keep_prefix
        job.undo = plan.undo

    # ---- decode ----

    def _decode(self, batch: Sequence[SegmentJob]) -> None:
        """One decode step for ``batch``; nothing of a job changes if it raises."""
        if self.before_job_work is not None:
            for job in batch:
                self.before_job_work(job)
        jobs = list(batch)
        self._after_frames(jobs, self._decode_step(jobs))

    def _decode_step(self, batch: list[SegmentJob]) -> list[int]:
        device = self._model.device
        steps = [len(j.frames) - 1 for j in batch]  # loop step index of the frame to make
        positions = [j.prompt_len + s for j, s in zip(batch, steps, strict=True)]
        slots = torch.tensor([j.stream.slot for j in batch], device=device)  # [B]
        frames_in = torch.stack([j.frames[-1] for j in batch])  # [B, C+1]
        new = decode_step(
            self._model,
            self._cache,
            frames_in,
            slots,
            torch.tensor(positions, device=device),
            max(positions) + 1,
            self._windows,
            torch.tensor(steps, device=device),
            BatchSampling.from_params([j.params for j in batch], device),
            [j.stream.rng for j in batch],
            fast=self._fast,
            slow=self._slow,
            upstream_draws=UPSTREAM_DRAWS,
        )  # [B, C+1]
        for job, frame in zip(batch, new, strict=True):
            job.frames.append(frame)
        return new[:, 0].tolist()  # the one host sync per step: stop checks need the tokens

    # ---- hand-off ----

    def _after_frames(self, jobs: list[SegmentJob], tokens: list[int]) -> None:
        for job, token in zip(jobs, tokens, strict=True):
            position = job.prompt_len + len(job.frames)
            job.finished = (
                (job.stop_on_im_end and token == self._im_end_id)
                or len(job.frames) >= job.max_frames
                or position >= self._cache.max_seq_len
            )
            self._guarded(job, self._emit)
            if job.finished:
                frames = torch.stack(job.frames, dim=1).cpu()  # [C+1, N]
                job.stream.conversation.completed(frames)

    def _emit(self, job: SegmentJob) -> None:
        """Hand frames to the vocoder per the chunk schedule (all of them once finished).

        Like upstream, the prefill frame is not vocoded and the final ``<|im_end|>`` frame is.
        A held job's frames wait for its confirmation.
        """
        if job.held:
            return
        pending = len(job.frames) - 1 - job.sent_frames
        now_s = time.perf_counter()
        lead_s = job.stream.clock.lead_s(now_s)
        next_chance_s = NEXT_CHANCE_ITERATIONS * (self._iteration_s.value or 0.0)
        if not job.finished and not job.schedule.due(
            job.sent_frames, pending, lead_s, next_chance_s
        ):
            return
        start = 1 + job.sent_frames
        if pending > 0:
            codes = torch.stack(job.frames[start : start + pending], dim=1)[1:]  # [C, n]
        else:
            codes = job.frames[0].new_zeros(self._model.config.num_codebooks, 0)
        job.sent_frames += pending
        job.stream.clock.produced(pending * job.stream.frame_s, now_s)
        job.on_codes(codes, job.finished)
