"""A Piper voice run in stages, so a sentence's first audio need not wait for all of it.

Piper's model (VITS) turns a sentence's phonemes into a prior over latent frames (text encoder
and durations), maps the prior to latent frames (the flow: ~15% of the time) and decodes the
frames into audio (a HiFi-GAN decoder: ~70%), all in one ONNX Runtime run whose first sample
comes with its last. The flow and the decoder are convolutional: an output frame depends only
on the frames within a fixed distance of its own, so a window of frames computed with that much
context on each side gives what computing all of them gives (but for float roundings: kernels
block their sums differently by length). The voice's graph is cut at the flow's and the
decoder's inputs (``onnx.utils.Extractor``) and each context is found at load, by computing a
sentence whole and in two windows: they must match (:func:`find_context_frames`); each
search starts at the stage's receptive field, read from its graph (:mod:`reach`). The flow's
windows then run link by link, cut between its couplings (:mod:`chain`): each link keeps its
exact frames, so a sentence's rest recomputes each coupling's context, not the whole flow's. A
voice whose flow cannot be cut runs its flow whole; one whose decoder cannot be cut runs whole,
as Piper runs it. The decoder is rewritten to run on ONNX Runtime's blocked convolution kernels
(:mod:`streamtts.piper.blocked`: 1.3-1.5x faster on this project's AVX-512 machine), once it has
made the same audio as the exported one for a calibration sentence.

Loudness: Piper scales each sentence to full scale once all of it is made (its
``normalize_audio``), which a sentence streamed in windows cannot wait for; every voice here is
scaled by one gain measured at load instead (the loudest of :data:`CALIBRATION_SENTENCES` to
:data:`CALIBRATION_PEAK`), so a voice's loudness also stays the same from sentence to sentence
and between the pieces of a sentence.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from streamtts.engine.base import PcmF32
from streamtts.piper.calibration_cache import Calibration
from streamtts.piper.chain import Chained, ChainPrefix, Link, RunLink, cut_chain

log = logging.getLogger(__name__)
Part = TypeVar("Part")
Other = TypeVar("Other")

# The decoder's first layer, by the weight name that Piper's VITS export gives it.
DECODER_WEIGHT = "dec.conv_pre.weight"
CONTEXT_FRAMES_TRIED = (16, 32, 64)
CALIBRATION_SENTENCES = (
    "Warming up now.",
    "The weather today is sunny, with a light breeze from the west.",
    "Absolutely fantastic news, congratulations!",
)
CALIBRATION_PEAK = 0.95
# Contexts are found on this many noise draws of a sentence and the largest kept: one draw can
# match with a smaller context by luck (the flow's 16 frames in about 1 load of 15, after which
# windows of other draws missed the tolerance in 16 of 30; with 32, none in 20).
CONTEXT_DRAWS = 3
# A window must equal the whole decode to this fraction of the whole's peak (differences
# measured: 2e-6 of it, from the kernels' blocking; a missing context gives 1e-2 and more).
WINDOW_TOLERANCE = 1e-5
# ONNX Runtime seeds each random node of a session from a process-wide seed, random per process
# unless set: the gain then varied with the start (1.20-1.44 over six starts of the bundled
# voice, 1.6 dB), so a voice was louder after one restart, or on one replica, than another.
# Set before a voice's sessions are made, it gives every start the same calibration draws.
NOISE_SEED = 20_251_203


class PiperNotInstalledError(RuntimeError):
    pass


@dataclass(frozen=True)
class Stages(Generic[Part]):
    """The parts of a voice's graph: phoneme ids to the flow's prior and mask (or, without a
    flow stage, to latent frames); prior and mask to latent frames; latent frames to audio —
    as ``onnx`` ModelProtos (:func:`split_graph`) or as ONNX Runtime sessions (:meth:`map`)."""

    front: Part
    flow: Part | None
    decoder: Part
    latent_name: str
    prior_names: tuple[str, str]  # the flow's inputs: its prior and the frames' mask
    speaker_input: bool  # the flow and decoder take the speaker id too (multi-speaker voices)
    # The flow cut between its couplings (chain.py); empty where it cannot be.
    flow_links: tuple[Link[Part], ...] = ()

    def map(self, make: Callable[[Part], Other]) -> Stages[Other]:
        """The same stages, each part made into another (a model into its session)."""
        flow = None if self.flow is None else make(self.flow)
        return Stages(
            make(self.front),
            flow,
            make(self.decoder),
            self.latent_name,
            self.prior_names,
            self.speaker_input,
            tuple(link.map(make) for link in self.flow_links),
        )


@dataclass
class Sentence:
    """A sentence after the front stage: what the later stages run over, by window."""

    arrays: tuple[np.ndarray, ...]  # [1, channels, frames] each: (prior, mask) or (latent,);
    # for a voice that runs whole, (audio,)
    latent: np.ndarray | None = None  # all its latent frames, where the flow runs whole
    run_options: Any = None  # onnxruntime.RunOptions of its stream: terminated on a cancel
    flow_prefix: ChainPrefix | None = None  # its latent frames made so far, link by link


def run_options() -> Any:
    """Options for one stream's runs: ``terminate`` set from another thread stops a run at
    once (it raises), so a cancelled stream never holds a worker for the rest of a sentence."""
    import onnxruntime

    return onnxruntime.RunOptions()


def split_graph(model: Any) -> Stages[Any] | None:
    """A Piper ONNX model (an ``onnx`` ModelProto) cut into its stages, or None where its
    decoder cannot be found. The flow is cut off where its nodes (scoped ``/flow/`` by the
    exporter) and its input are found; else it stays in the front."""
    import onnx.utils

    graph = model.graph
    convs = [n for n in graph.node if n.op_type == "Conv" and DECODER_WEIGHT in n.input]
    if len(convs) != 1:
        return None
    latent = convs[0].input[0]
    inputs = [i.name for i in graph.input]
    speaker = ["sid"] if "sid" in inputs else []
    extractor = onnx.utils.Extractor(model)
    decoder = extractor.extract_model([latent, *speaker], [o.name for o in graph.output])
    prior_names = _flow_inputs(graph, latent)
    if prior_names is not None:
        try:
            front = extractor.extract_model(inputs, list(prior_names))
            flow = extractor.extract_model([*prior_names, *speaker], [latent])
        except Exception:  # an unexpected graph: the flow stays in the front
            log.warning("Piper voice: its flow could not be cut off; it runs whole", exc_info=True)
        else:
            links = _flow_links(flow, prior_names, speaker)
            return Stages(front, flow, decoder, latent, prior_names, bool(speaker), links)
    front = extractor.extract_model(inputs, [latent])
    return Stages(front, None, decoder, latent, ("", ""), bool(speaker))


def _flow_links(
    flow: Any, prior_names: tuple[str, str], speaker: list[str]
) -> tuple[Link[Any], ...]:
    """The flow cut between its couplings (:mod:`chain`), or () where it cannot be."""
    try:
        links = cut_chain(flow, prior_names[0], windowed=[prior_names[1]], fixed=speaker)
    except Exception:  # an unexpected graph: the flow runs in windows with all its context
        log.warning("Piper voice: its flow could not be cut into links", exc_info=True)
        return ()
    return links or ()


def _flow_inputs(graph: Any, latent: str) -> tuple[str, str] | None:
    """(prior, mask): the first ``/flow/`` node's input and the mask the flow's output is
    multiplied by (``z * y_mask``, the decoder's input), or None."""
    flow_nodes = [n for n in graph.node if n.name.startswith("/flow/")]
    producer = next((n for n in graph.node if latent in n.output), None)
    if not flow_nodes or producer is None or producer.op_type != "Mul":
        return None
    flow_outputs = {o for n in flow_nodes for o in n.output}
    masks = [i for i in producer.input if i not in flow_outputs]
    if len(masks) != 1 or len(producer.input) != 2 or not flow_nodes[0].input:
        return None
    return flow_nodes[0].input[0], masks[0]


class StagedVoice:
    """One Piper voice: phonemes to a :class:`Sentence`, then its audio whole or by window.

    Runs on one worker thread at a time per call (ONNX Runtime sessions are thread-safe)."""

    def __init__(
        self,
        piper_voice: Any,
        whole: Any,
        stages: Stages[Any] | None,
    ) -> None:
        self.piper_voice = piper_voice  # piper.PiperVoice: its phonemizer and config
        self._whole = whole  # the unsplit session, where the graph could not be cut (else None)
        self._stages = stages
        config = piper_voice.config
        self.sample_rate = int(config.sample_rate)
        self.hop_samples = int(config.hop_length)
        self.context_frames: int | None = None  # the decoder's; None: decoded whole only
        # The stages' receptive fields from their graphs (reach.py; None: not known): no
        # smaller context is tried, as one that matched would have matched by luck.
        self.decoder_reach_frames: int | None = None
        self.flow_reach_frames: int | None = None
        self.flow_context_frames: int | None = None  # None: the flow runs whole
        # The flow's windows run link by link, each link keeping its exact frames (chain.py):
        # set once calibration has checked that this makes what the flow makes whole.
        self.flow_chained = False
        self.gain = 1.0
        self.decodes_blocked = False  # decoding on ONNX Runtime's blocked kernels (blocked.py)
        self._speaker = (
            np.array([config.default_speaker_id], dtype=np.int64)
            if config.num_speakers > 1
            else None
        )

    @property
    def splittable(self) -> bool:
        return self._stages is not None

    @property
    def has_flow_stage(self) -> bool:
        return self._stages is not None and self._stages.flow is not None

    def phoneme_ids(self, text: str) -> list[list[int]]:
        """Piper's phoneme ids, one list per sentence."""
        voice = self.piper_voice
        return [voice.phonemes_to_ids(p) for p in voice.phonemize(text) if p]

    def scales(self, speed: float) -> np.ndarray:
        config = self.piper_voice.config
        return np.array(
            [config.noise_scale, config.length_scale / speed, config.noise_w_scale],
            dtype=np.float32,
        )

    def sentence(
        self, phoneme_ids: list[int], scales: np.ndarray, run_options: Any = None
    ) -> Sentence:
        """A sentence through the front stage (random: Piper draws noise). Its runs take
        ``run_options`` (:func:`run_options`), so a cancel can stop one midway."""
        feeds: dict[str, np.ndarray] = {
            "input": np.array([phoneme_ids], dtype=np.int64),
            "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64),
            "scales": scales,
        }
        if self._speaker is not None:
            feeds["sid"] = self._speaker
        if self._stages is None:
            audio = self._whole.run(None, feeds, run_options)[0]
            return Sentence((np.asarray(audio, dtype=np.float32).reshape(-1),), None, run_options)
        outputs = self._stages.front.run(None, feeds, run_options)
        arrays = tuple(np.asarray(o, dtype=np.float32) for o in outputs)
        return Sentence(arrays, None, run_options)

    @staticmethod
    def frames(sentence: Sentence) -> int:
        first = sentence.arrays[0]
        return int(first.shape[-1]) if first.ndim == 3 else 0

    @property
    def frame_s(self) -> float:
        """Seconds of audio per latent frame."""
        return self.hop_samples / self.sample_rate

    def window_pays(self, window_frames: int, frames: int) -> bool:
        """Whether ``frames`` of a sentence can go out as a first window of ``window_frames``
        and the rest: the voice decodes by window, and the window with its context is not
        already all of them."""
        return self.context_frames is not None and window_frames + self.context_frames < frames

    def render(self, sentence: Sentence, start: int = 0, stop: int | None = None) -> PcmF32:
        """Raw audio of latent frames ``[start, stop)`` (all of them by default), each stage
        run with its context on each side."""
        total = self.frames(sentence)
        stop = total if stop is None else stop
        if (start, stop) == (0, total):
            return self._render(sentence, 0, total, 0, 0)
        if self.context_frames is None:
            raise ValueError("this voice decodes whole sentences only")
        return self._render(sentence, start, stop, self.context_frames, self.flow_context_frames)

    def _render(
        self, sentence: Sentence, start: int, stop: int, context: int, flow_context: int | None
    ) -> PcmF32:
        if self._stages is None:
            return sentence.arrays[0]  # already audio
        total = self.frames(sentence)
        low, high = max(0, start - context), min(total, stop + context)
        feeds = self._decoder_feeds(self._latent(sentence, low, high, flow_context))
        decoded = self._stages.decoder.run(None, feeds, sentence.run_options)[0]
        audio = np.asarray(decoded, dtype=np.float32).reshape(-1)
        if audio.size != (high - low) * self.hop_samples:
            raise RuntimeError(
                f"the decoder made {audio.size} samples of {high - low} frames, not "
                f"{self.hop_samples} a frame"
            )
        head = (start - low) * self.hop_samples
        kept: PcmF32 = audio[head : head + (stop - start) * self.hop_samples]
        return kept

    def _decoder_feeds(self, latent: np.ndarray) -> dict[str, np.ndarray]:
        assert self._stages is not None
        return {self._stages.latent_name: latent, **self._speaker_feed()}

    def _speaker_feed(self) -> dict[str, np.ndarray]:
        """The speaker id the flow and decoder of a multi-speaker voice take (else nothing)."""
        stages = self._stages
        if stages is None or not stages.speaker_input or self._speaker is None:
            return {}
        return {"sid": self._speaker}

    def adopt_decoder(self, candidate: Any) -> bool:
        """Decode with ``candidate`` (an ONNX Runtime session of a rewritten decoder) from now
        on if, for a calibration sentence, it makes the audio the current decoder makes (to
        :data:`WINDOW_TOLERANCE` of its peak); else keep the current decoder."""
        stages = self._stages
        if stages is None:
            return False
        (ids, *_) = self.phoneme_ids(CALIBRATION_SENTENCES[1])
        sentence = self.sentence(ids, self.scales(1.0))
        feeds = self._decoder_feeds(self._latent(sentence, 0, self.frames(sentence), None))
        reference = np.asarray(stages.decoder.run(None, feeds)[0], dtype=np.float32)
        made = np.asarray(candidate.run(None, feeds)[0], dtype=np.float32)
        if not matches(made, reference):
            return False
        self.use_blocked_decoder(candidate)
        return True

    def use_blocked_decoder(self, candidate: Any) -> None:
        """Decode with ``candidate`` from now on (checked by :meth:`adopt_decoder`, or when the
        stored calibration that names it was found)."""
        assert self._stages is not None
        self._stages = dataclasses.replace(self._stages, decoder=candidate)
        self.decodes_blocked = True

    def calibration(self) -> Calibration:
        """What calibrating this voice found, to be kept for the next start."""
        return Calibration(
            self.context_frames,
            self.flow_context_frames,
            self.flow_chained,
            self.decodes_blocked,
            self.gain,
        )

    def restore(self, calibration: Calibration) -> bool:
        """Take what an earlier calibration of this voice found (its blocked decoder already in
        use, where it found one), then check it here (:meth:`holds`). False: it does not hold,
        and this voice is to be loaded again."""
        if calibration.decodes_blocked != self.decodes_blocked:
            return False
        self.context_frames = calibration.context_frames
        self.flow_context_frames = calibration.flow_context_frames
        self.gain = calibration.gain
        if calibration.flow_chained:
            stages = self._stages
            if stages is None or not stages.flow_links or self.flow_context_frames is None:
                return False
            self._stages = dataclasses.replace(stages, flow=Chained(stages.flow_links))
            self.flow_chained = True
        return self.holds()

    def holds(self) -> bool:
        """A calibration sentence made as a first window and the rest equals it made whole (to
        :data:`WINDOW_TOLERANCE` of its peak); True where the voice decodes whole sentences
        only. Either way its sessions have run once."""
        (ids, *_) = self.phoneme_ids(CALIBRATION_SENTENCES[1])
        sentence = self.sentence(ids, self.scales(1.0))
        whole = self.render(sentence)
        total = self.frames(sentence)
        if self.context_frames is None or total < 3:
            return True
        fresh = Sentence(sentence.arrays, run_options=sentence.run_options)
        head = total // 3
        windows = np.concatenate([self.render(fresh, 0, head), self.render(fresh, head)])
        return matches(windows, whole)

    def chain_flow(self, sentence: Sentence) -> bool:
        """Run the flow's windows link by link from now on (:mod:`chain`) if, for ``sentence``,
        a first window and then the rest made so equal the flow made whole (to
        :data:`WINDOW_TOLERANCE` of its peak); else keep running them with all their context."""
        stages = self._stages
        if stages is None or not stages.flow_links:
            return False
        total = self.frames(sentence)
        whole = self._latent(sentence, 0, total, None)
        fresh = Sentence(sentence.arrays, run_options=sentence.run_options)
        try:
            prefix, run = self._flow_prefix(fresh), self._link_runner(fresh)
            prefix.through(total // 3, run)
            made = prefix.through(total, run)
        except Exception:  # an unexpected graph: its windows run with all of their context
            log.warning("Piper voice: its flow's links do not run", exc_info=True)
            self.flow_chained = False
            return False
        chained = Chained(stages.flow_links)
        whole_chained = self._flow(fresh, 0, total, chained)
        self.flow_chained = matches(made, whole) and matches(whole_chained, whole)
        if self.flow_chained:  # whole sentences through the links too: one copy of the weights
            self._stages = dataclasses.replace(stages, flow=chained)
        return self.flow_chained

    def _latent(
        self, sentence: Sentence, low: int, high: int, flow_context: int | None
    ) -> np.ndarray:
        """Latent frames ``[low, high)``: the flow run over them with ``flow_context`` frames
        on each side (None: over all of the sentence, once); once the flow is chained, its
        links extended through ``high`` from where the sentence's last window left them."""
        stages = self._stages
        assert stages is not None
        if stages.flow is None:
            return sentence.arrays[0][:, :, low:high]
        total = self.frames(sentence)
        if flow_context is None or (low, high) == (0, total):
            if sentence.latent is None:
                sentence.latent = self._flow(sentence, 0, total)
            return sentence.latent[:, :, low:high]
        if self.flow_chained:
            return self._flow_prefix(sentence).through(high, self._link_runner(sentence))[
                :, :, low:high
            ]
        first, last = max(0, low - flow_context), min(total, high + flow_context)
        return self._flow(sentence, first, last)[:, :, low - first : high - first]

    def _flow_prefix(self, sentence: Sentence) -> ChainPrefix:
        stages = self._stages
        assert stages is not None
        if sentence.flow_prefix is None:
            prior, mask = sentence.arrays
            sentence.flow_prefix = ChainPrefix(
                stages.flow_links, prior, {stages.prior_names[1]: mask}, self._speaker_feed()
            )
        return sentence.flow_prefix

    @staticmethod
    def _link_runner(sentence: Sentence) -> RunLink:
        def run(link: Link[Any], feeds: dict[str, np.ndarray]) -> np.ndarray:
            made = link.part.run(None, feeds, sentence.run_options)[0]
            return np.asarray(made, dtype=np.float32)

        return run

    def _flow(self, sentence: Sentence, low: int, high: int, flow: Any = None) -> np.ndarray:
        """The flow (``flow``, or the voice's) run over frames ``[low, high)``."""
        stages = self._stages
        assert stages is not None and stages.flow is not None
        flow = stages.flow if flow is None else flow
        prior, mask = sentence.arrays
        feeds = {
            stages.prior_names[0]: prior[:, :, low:high],
            stages.prior_names[1]: mask[:, :, low:high],
            **self._speaker_feed(),
        }
        return np.asarray(flow.run(None, feeds, sentence.run_options)[0], dtype=np.float32)

    def scaled(self, raw: PcmF32) -> PcmF32:
        """Raw audio at the voice's gain, within [-1, 1]."""
        scaled: PcmF32 = np.clip(raw * self.gain, -1.0, 1.0).astype(np.float32)
        return scaled


def find_context_frames(
    voice: StagedVoice, sentence: Sentence, whole: PcmF32 | None = None
) -> tuple[int | None, int | None]:
    """(the decoder's, the flow's) least contexts (of :data:`CONTEXT_FRAMES_TRIED`) with which a
    sentence made in two windows equals it made whole (``whole``, its audio if it is made
    already); None for a stage where none does (or the sentence is too short to tell). The
    decoder's windows are checked with the flow's windows (the flow whole, if they fail)."""
    total = voice.frames(sentence)
    if total == 0:
        return None, None
    flow_context = None
    if voice.has_flow_stage:
        latent = voice._latent(sentence, 0, total, None)
        flow_context = _least_context(
            total,
            latent,
            lambda a, b, c: voice._latent(sentence, a, b, c),
            _tried(voice.flow_reach_frames),
        )
    whole = voice.render(sentence) if whole is None else whole
    context = _least_context(
        total,
        whole,
        lambda a, b, c: voice._render(sentence, a, b, c, flow_context),
        _tried(voice.decoder_reach_frames),
    )
    return context, flow_context


def _tried(reach_frames: int | None) -> tuple[int, ...]:
    """The contexts tried for a stage: where its receptive field is known, that, then the
    larger of :data:`CONTEXT_FRAMES_TRIED` (should windows differ there, which would be our
    bug); else all of them."""
    if reach_frames is None:
        return CONTEXT_FRAMES_TRIED
    return (reach_frames, *(c for c in CONTEXT_FRAMES_TRIED if c > reach_frames))


def _least_context(
    total: int,
    whole: np.ndarray,
    window: Callable[[int, int, int], np.ndarray],
    tried: tuple[int, ...] = CONTEXT_FRAMES_TRIED,
) -> int | None:
    """The least context of ``tried`` with which ``window(start, stop, context)`` of two halves
    joins to ``whole`` (along its last axis)."""
    cut = total // 2
    for context in tried:
        if cut <= 2 * context:
            break
        joined = np.concatenate([window(0, cut, context), window(cut, total, context)], axis=-1)
        if matches(joined, whole):
            return context
    return None


def matches(made: np.ndarray, reference: np.ndarray) -> bool:
    """``made`` has ``reference``'s shape and is within :data:`WINDOW_TOLERANCE` of its peak."""
    if made.shape != reference.shape:
        return False
    peak = float(np.abs(reference).max())
    return bool(np.abs(made - reference).max() <= WINDOW_TOLERANCE * peak)


def cost_under_load(voice: StagedVoice, head_frames: int) -> tuple[float, float]:
    """(compute, audio) seconds of the calibration sentences made as the engine makes a
    listener's first sentence: a first window of ``head_frames``, then the rest (whole where
    the voice cannot be cut). Run on every worker at once, it is the cost admission starts
    from: a sentence made whole on an idle worker costs ~1.35x less than what the engine
    learns under load (the windows' context, the workers sharing the cores)."""
    scales = voice.scales(1.0)
    compute_s = audio_samples = 0.0
    for text in CALIBRATION_SENTENCES:
        for ids in voice.phoneme_ids(text):
            started_s = time.perf_counter()
            sentence = voice.sentence(ids, scales)
            frames = voice.frames(sentence)
            context = voice.context_frames
            if context is not None and frames > head_frames + context:
                parts = [
                    voice.render(sentence, 0, head_frames),
                    voice.render(sentence, head_frames),
                ]
            else:
                parts = [voice.render(sentence)]
            compute_s += time.perf_counter() - started_s
            audio_samples += sum(part.size for part in parts)
    return compute_s, audio_samples / voice.sample_rate


def calibrate(voice: StagedVoice, threads: int = 1) -> None:
    """Find the voice's contexts (on :data:`CONTEXT_DRAWS` draws of the longest calibration
    sentence) and its gain (see the module's docstring); the sessions are warm by then. The
    sentences go through the front stage (which draws Piper's noise) on this thread, then are
    made on ``threads`` threads at once (ONNX Runtime sessions run concurrently): at start the
    cores are idle, later they serve streams."""
    scales = voice.scales(1.0)
    every_ids = [ids for text in CALIBRATION_SENTENCES for ids in voice.phoneme_ids(text)]
    sentences = [voice.sentence(ids, scales) for ids in every_ids]
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="piper-calibrate") as pool:
        wholes = list(pool.map(voice.render, sentences))
        if voice.splittable and sentences:
            longest = max(range(len(sentences)), key=lambda i: voice.frames(sentences[i]))
            draws: list[tuple[Sentence, PcmF32 | None]] = [
                (sentences[longest], wholes[longest]),
                *(
                    (voice.sentence(every_ids[longest], scales), None)
                    for _ in range(CONTEXT_DRAWS - 1)
                ),
            ]
            found = list(pool.map(lambda draw: find_context_frames(voice, *draw), draws))
            voice.context_frames = _largest([decoder for decoder, _ in found])
            voice.flow_context_frames = _largest([flow for _, flow in found])
            if voice.flow_context_frames is not None and not voice.chain_flow(draws[0][0]):
                log.info("Piper voice: its flow runs in windows with all of its context")
            if voice.context_frames is None:
                log.warning("Piper voice: windows of its decoder do not match; it decodes whole")
    loudest = max((float(np.abs(whole).max()) for whole in wholes), default=0.0)
    voice.gain = CALIBRATION_PEAK / loudest if loudest > 1e-6 else 1.0


def _largest(contexts: list[int | None]) -> int | None:
    """The context every draw matched with (None where one matched with none)."""
    return None if any(c is None for c in contexts) else max(c for c in contexts if c is not None)
