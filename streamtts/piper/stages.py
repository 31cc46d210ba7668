"""A Piper voice run in two stages, so a sentence's first audio need not wait for all of it.

Piper's model (VITS) turns a sentence's phonemes into latent frames (text encoder, durations,
flow) and then decodes the frames into audio (a HiFi-GAN decoder, ~70% of the time), all in one
ONNX Runtime run whose first sample comes with its last. The decoder is convolutional: a sample
depends only on the latent frames within a fixed distance of its own, so a window of frames
decoded with that much context on each side gives the samples that decoding all of them gives
(but for float roundings: kernels block their sums differently by length). The voice's graph
is cut at the decoder's input (``onnx.utils.Extractor``) and the context is found at load, by
decoding a sentence whole and in two windows: they must match (:func:`find_context_frames`).
A voice whose graph cannot be cut runs whole, as Piper runs it.

Loudness: Piper scales each sentence to full scale once all of it is made (its
``normalize_audio``), which a sentence streamed in windows cannot wait for; every voice here is
scaled by one gain measured at load instead (the loudest of :data:`CALIBRATION_SENTENCES` to
:data:`CALIBRATION_PEAK`), so a voice's loudness also stays the same from sentence to sentence
and between the pieces of a sentence.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamtts.engine.base import PcmF32

log = logging.getLogger(__name__)

# The decoder's first layer, by the weight name that Piper's VITS export gives it.
DECODER_WEIGHT = "dec.conv_pre.weight"
CONTEXT_FRAMES_TRIED = (16, 32, 64)
CALIBRATION_SENTENCES = (
    "Warming up now.",
    "The weather today is sunny, with a light breeze from the west.",
    "Absolutely fantastic news, congratulations!",
)
CALIBRATION_PEAK = 0.95
# A window must equal the whole decode to this fraction of the whole's peak (differences
# measured: 2e-6 of it, from the kernels' blocking; a missing context gives 1e-2 and more).
WINDOW_TOLERANCE = 1e-5


class PiperNotInstalledError(RuntimeError):
    pass


@dataclass
class Stages:
    """The two halves of a voice's graph: phoneme ids to latent frames, frames to audio."""

    front: Any  # onnxruntime.InferenceSession
    decoder: Any
    latent_name: str
    speaker_input: bool  # the decoder takes the speaker id too (multi-speaker voices)


def split_graph(model: Any) -> tuple[Any, Any, str] | None:
    """(front, decoder, the latent tensor's name) of a Piper ONNX model (an ``onnx``
    ModelProto), or None where its decoder cannot be found."""
    import onnx.utils

    graph = model.graph
    convs = [n for n in graph.node if n.op_type == "Conv" and DECODER_WEIGHT in n.input]
    if len(convs) != 1:
        return None
    latent = convs[0].input[0]
    inputs = [i.name for i in graph.input]
    extractor = onnx.utils.Extractor(model)
    front = extractor.extract_model(inputs, [latent])
    decoder_inputs = [latent] + (["sid"] if "sid" in inputs else [])
    decoder = extractor.extract_model(decoder_inputs, [o.name for o in graph.output])
    return front, decoder, latent


class StagedVoice:
    """One Piper voice: phonemes to latent frames, then frames to audio whole or by window.

    Runs on one worker thread at a time per call (ONNX Runtime sessions are thread-safe)."""

    def __init__(
        self,
        piper_voice: Any,
        whole: Any,
        stages: Stages | None,
    ) -> None:
        self.piper_voice = piper_voice  # piper.PiperVoice: its phonemizer and config
        self._whole = whole  # the unsplit session, where the graph could not be cut (else None)
        self._stages = stages
        config = piper_voice.config
        self.sample_rate = int(config.sample_rate)
        self.hop_samples = int(config.hop_length)
        self.context_frames: int | None = None  # None: decoded whole only
        self.gain = 1.0
        self.measured = (0.0, 0.0)  # (compute, audio) seconds of a sentence, by calibrate()
        self._speaker = (
            np.array([config.default_speaker_id], dtype=np.int64)
            if config.num_speakers > 1
            else None
        )

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

    def latent(self, phoneme_ids: list[int], scales: np.ndarray) -> np.ndarray:
        """A sentence's latent frames ``[1, channels, frames]`` (random: Piper draws noise);
        for a voice that runs whole, its raw audio ``[samples]``."""
        feeds: dict[str, np.ndarray] = {
            "input": np.array([phoneme_ids], dtype=np.int64),
            "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64),
            "scales": scales,
        }
        if self._speaker is not None:
            feeds["sid"] = self._speaker
        session = self._whole if self._stages is None else self._stages.front
        out = np.asarray(session.run(None, feeds)[0], dtype=np.float32)
        return out.reshape(-1) if self._stages is None else out

    @property
    def splittable(self) -> bool:
        return self._stages is not None

    @staticmethod
    def frames(latent: np.ndarray) -> int:
        return int(latent.shape[-1]) if latent.ndim == 3 else 0

    def render(self, latent: np.ndarray, start: int = 0, stop: int | None = None) -> PcmF32:
        """Raw audio of latent frames ``[start, stop)`` (all of them by default), decoded
        with :attr:`context_frames` on each side."""
        if self._stages is None:
            return latent  # already audio
        total = self.frames(latent)
        stop = total if stop is None else stop
        context = 0 if (start, stop) == (0, total) else self.context_frames
        if context is None:
            raise ValueError("this voice decodes whole sentences only")
        low, high = max(0, start - context), min(total, stop + context)
        feeds = {self._stages.latent_name: latent[:, :, low:high]}
        if self._stages.speaker_input and self._speaker is not None:
            feeds["sid"] = self._speaker
        audio = np.asarray(self._stages.decoder.run(None, feeds)[0], dtype=np.float32).reshape(-1)
        if audio.size != (high - low) * self.hop_samples:
            raise RuntimeError(
                f"the decoder made {audio.size} samples of {high - low} frames, not "
                f"{self.hop_samples} a frame"
            )
        head = (start - low) * self.hop_samples
        kept: PcmF32 = audio[head : head + (stop - start) * self.hop_samples]
        return kept

    def scaled(self, raw: PcmF32) -> PcmF32:
        """Raw audio at the voice's gain, within [-1, 1]."""
        scaled: PcmF32 = np.clip(raw * self.gain, -1.0, 1.0).astype(np.float32)
        return scaled


def find_context_frames(
    voice: StagedVoice, latent: np.ndarray, whole: PcmF32 | None = None
) -> int | None:
    """The least context (of :data:`CONTEXT_FRAMES_TRIED`) with which a sentence decoded in two
    windows equals it decoded whole (``whole``, if it is decoded already); None if none does
    (or the sentence is too short to tell)."""
    total = voice.frames(latent)
    if total == 0:
        return None
    whole = voice.render(latent) if whole is None else whole
    peak = float(np.abs(whole).max())
    for context in CONTEXT_FRAMES_TRIED:
        cut = total // 2
        if cut <= 2 * context:
            break
        voice.context_frames = context
        windows = np.concatenate([voice.render(latent, 0, cut), voice.render(latent, cut)])
        if float(np.abs(windows - whole).max()) <= WINDOW_TOLERANCE * peak:
            return context
    voice.context_frames = None
    return None


def load_voice(model: Path, config: Path, onnx_threads: int) -> StagedVoice:
    """The voice, its sessions running ``onnx_threads`` intra-op threads each (Piper's own
    loader gives every session one thread per core: with several workers, more threads than
    cores); split, its context found and its gain measured (a few sentences' worth of work)."""
    try:
        import onnx
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise PiperNotInstalledError(
            "Piper is not installed: pip install 'streamtts[piper]'"
        ) from exc
    if not model.is_file():
        raise FileNotFoundError(f"Piper voice not found: {model}")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = onnx_threads
    options.inter_op_num_threads = 1

    def session(source: str | bytes) -> Any:
        return onnxruntime.InferenceSession(
            source, sess_options=options, providers=["CPUExecutionProvider"]
        )

    piper_config = PiperConfig.from_dict(json.loads(config.read_text(encoding="utf-8")))
    split = split_graph(onnx.load(str(model)))
    if split is None:
        log.warning("Piper voice %s: no decoder found in its graph; it runs whole", model)
        whole = session(str(model))
        voice = StagedVoice(PiperVoice(session=whole, config=piper_config), whole, None)
    else:
        front, decoder, latent_name = split
        speaker_input = any(i.name == "sid" for i in decoder.graph.input)
        stages = Stages(
            session(front.SerializeToString()),
            session(decoder.SerializeToString()),
            latent_name,
            speaker_input,
        )
        voice = StagedVoice(PiperVoice(session=stages.front, config=piper_config), None, stages)
    calibrate(voice)
    return voice


def calibrate(voice: StagedVoice) -> None:
    """Find the voice's decoder context (on the longest calibration sentence) and its gain
    (see the module's docstring); :attr:`StagedVoice.measured` is the cost of the last
    sentence (the sessions warm by then), which admission starts from."""
    scales = voice.scales(1.0)
    made: list[tuple[np.ndarray, PcmF32]] = []
    for sentence in CALIBRATION_SENTENCES:
        for ids in voice.phoneme_ids(sentence):
            started_s = time.perf_counter()
            latent = voice.latent(ids, scales)
            made.append((latent, voice.render(latent)))
            voice.measured = (time.perf_counter() - started_s, made[-1][1].size / voice.sample_rate)
    if voice.splittable and made:
        latent, whole = max(made, key=lambda m: voice.frames(m[0]))
        voice.context_frames = find_context_frames(voice, latent, whole)
        if voice.context_frames is None:
            log.warning("Piper voice: windows of its decoder do not match; it decodes whole")
    loudest = max((float(np.abs(whole).max()) for _, whole in made), default=0.0)
    voice.gain = CALIBRATION_PEAK / loudest if loudest > 1e-6 else 1.0
