"""The bundled voice in two stages: decoded in windows it is the same audio as decoded whole."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from streamtts.piper.engine import HEAD_FRAMES, bundled_voice_paths
from streamtts.piper.load import load_voice
from streamtts.piper.stages import (
    CALIBRATION_PEAK,
    CALIBRATION_SENTENCES,
    WINDOW_TOLERANCE,
    Sentence,
    StagedVoice,
    Stages,
    calibrate,
    cost_under_load,
    find_context_frames,
    run_options,
    split_graph,
)

LONG_SENTENCE = "The weather today is sunny with a light breeze from the west, and mild."


def latent_of(voice: StagedVoice, text: str) -> Sentence:
    (ids,) = voice.phoneme_ids(text)
    return voice.sentence(ids, voice.scales(1.0))


def test_the_bundled_voice_is_split_with_a_context_that_windows_match(voice: StagedVoice) -> None:
    assert voice.splittable and voice.has_flow_stage and voice.decodes_blocked
    assert voice.flow_chained  # the windows below run the flow link by link (chain.py)
    assert voice.context_frames is not None and voice.flow_context_frames is not None
    latent = latent_of(voice, LONG_SENTENCE)
    frames = voice.frames(latent)
    whole = voice.render(latent)
    assert whole.size == frames * voice.hop_samples
    for cuts in ([HEAD_FRAMES], [HEAD_FRAMES, 2 * HEAD_FRAMES, frames // 2], [1, frames - 1]):
        bounds = [0, *cuts, frames]
        windows = [voice.render(latent, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
        assert [w.size for w in windows] == [
            (b - a) * voice.hop_samples for a, b in zip(bounds, bounds[1:], strict=False)
        ]
        # The same samples but for float roundings (kernels block differently by length).
        tolerance = WINDOW_TOLERANCE * np.abs(whole).max()
        np.testing.assert_allclose(np.concatenate(windows), whole, rtol=0, atol=tolerance)


def test_without_its_context_a_window_differs(voice: StagedVoice) -> None:
    """The check the contexts are found by can fail: each stage's context matters."""
    latent = latent_of(voice, LONG_SENTENCE)
    whole = voice.render(latent)
    found = voice.context_frames, voice.flow_context_frames, voice.flow_chained
    heads = []
    try:
        # The flow's context is tested unchained: its links take their reach from the graph.
        voice.flow_chained = False
        for contexts in ((0, found[1]), (found[0], 0)):
            voice.context_frames, voice.flow_context_frames = contexts
            # A window inside the sentence misses the context on both sides (a first
            # window's flow only on its right, which some noise draws leave within 10x).
            heads.append(voice.render(Sentence(latent.arrays), HEAD_FRAMES, 2 * HEAD_FRAMES))
    finally:
        voice.context_frames, voice.flow_context_frames, voice.flow_chained = found
    tolerance = WINDOW_TOLERANCE * np.abs(whole).max()
    inside = whole[HEAD_FRAMES * voice.hop_samples : 2 * HEAD_FRAMES * voice.hop_samples]
    for head in heads:  # without the decoder's context, and without the flow's
        assert np.abs(head - inside).max() > 10 * tolerance


def test_one_gain_for_the_voice_keeps_quiet_sentences_quiet(voice: StagedVoice) -> None:
    """Piper scaled every sentence to full scale; one gain keeps their loudness apart."""
    assert 0.5 < voice.gain < 10
    quiet = voice.scaled(voice.render(latent_of(voice, "Hmm.")))
    loud = voice.scaled(
        voice.render(latent_of(voice, "Absolutely fantastic news, congratulations!"))
    )
    assert np.abs(loud).max() <= 1.0
    assert np.abs(quiet).max() < 0.8 * np.abs(loud).max()
    assert np.abs(loud).max() > 0.5 * CALIBRATION_PEAK


class _NotLocal:
    """A decoder whose every sample depends on all of its frames (a running sum)."""

    def run(self, _outputs: Any, feeds: dict[str, np.ndarray], _options: Any) -> list[np.ndarray]:
        (latent,) = feeds.values()
        return [np.repeat(np.cumsum(latent[0, 0]), 4)[None, None, :].astype(np.float32)]


def test_a_decoder_whose_windows_never_match_decodes_whole(voice: StagedVoice) -> None:
    fake = StagedVoice(
        voice.piper_voice, None, Stages(None, None, _NotLocal(), "z", ("", ""), False)
    )
    fake.hop_samples = 4
    latent = Sentence((np.random.default_rng(0).normal(size=(1, 2, 400)).astype(np.float32),))
    assert find_context_frames(fake, latent) == (None, None)
    with pytest.raises(ValueError, match="whole sentences only"):
        fake.render(latent, 0, 10)
    assert fake.render(latent).size == 1600  # whole still works


def test_a_graph_without_piper_s_decoder_is_not_split() -> None:
    node = helper.make_node("Identity", ["input"], ["output"])
    graph = helper.make_graph(
        [node],
        "not-vits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])],
    )
    assert split_graph(helper.make_model(graph)) is None


def test_the_split_halves_chain_to_the_voice_s_output(split: Stages[Any]) -> None:
    assert split.flow is not None
    assert [o.name for o in split.front.graph.output] == list(split.prior_names)
    assert [i.name for i in split.flow.graph.input] == list(split.prior_names)
    assert [o.name for o in split.flow.graph.output] == [split.latent_name]
    assert [i.name for i in split.decoder.graph.input] == [split.latent_name]
    assert [o.name for o in split.decoder.graph.output] == ["output"]


def test_a_voice_that_runs_whole_speaks_calibrated_with_no_windows(voice: StagedVoice) -> None:
    import onnxruntime

    model, _ = bundled_voice_paths()
    whole = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    plain = StagedVoice(voice.piper_voice, whole, None)
    calibrate(plain)
    assert not plain.splittable and not plain.has_flow_stage and plain.context_frames is None
    assert 0.5 < plain.gain < 10
    audio = plain.render(latent_of(plain, LONG_SENTENCE))
    assert audio.ndim == 1 and audio.size > plain.sample_rate  # over a second of it
    assert plain.frames(latent_of(plain, LONG_SENTENCE)) == 0  # nothing to window


def test_terminated_run_options_stop_a_sentence_s_runs(voice: StagedVoice) -> None:
    """What a cancel sets: a run with them raises instead of finishing the sentence."""
    (ids,) = voice.phoneme_ids(LONG_SENTENCE)
    options = run_options()
    sentence = voice.sentence(ids, voice.scales(1.0), options)
    assert voice.render(sentence, 0, HEAD_FRAMES).size > 0
    options.terminate = True
    with pytest.raises(Exception, match="(?i)terminat"):
        voice.render(sentence, HEAD_FRAMES)


def test_the_start_up_cost_is_the_engine_s_way_of_making_a_first_sentence(
    voice: StagedVoice,
) -> None:
    """A first window, then the rest: the audio of each calibration sentence, whole."""
    compute_s, audio_s = cost_under_load(voice, HEAD_FRAMES)
    assert compute_s > 0
    sentences = [ids for text in CALIBRATION_SENTENCES for ids in voice.phoneme_ids(text)]
    frames = [voice.frames(voice.sentence(ids, voice.scales(1.0))) for ids in sentences]
    # Durations are drawn, so each sentence's length varies a little from draw to draw.
    expected_s = sum(frames) * voice.hop_samples / voice.sample_rate
    assert audio_s == pytest.approx(expected_s, rel=0.25)
    assert any(f > HEAD_FRAMES + (voice.context_frames or 0) for f in frames)  # some cut


def test_contexts_are_the_largest_any_draw_needs(
    voice: StagedVoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One noise draw can match with a smaller context than others need: calibration keeps the
    largest over its draws, and none where a draw matched with none."""
    from streamtts.piper import stages

    found = iter([(16, 16), (16, 32), (16, 16)])
    monkeypatch.setattr(stages, "find_context_frames", lambda *_: next(found))
    calibrate(voice)
    assert (voice.context_frames, voice.flow_context_frames) == (16, 32)
    found = iter([(16, 32), (None, None), (16, 32)])
    calibrate(voice)
    assert voice.context_frames is None and voice.flow_context_frames is None
    monkeypatch.undo()
    calibrate(voice)  # as found for real again, for the module's other tests
    assert voice.context_frames is not None


def test_calibrating_on_two_threads_finds_the_contexts_one_finds(
    voice: StagedVoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start the engine calibrates on every worker's core."""
    found_alone = (voice.context_frames, voice.flow_context_frames)
    threads: set[str] = set()
    render = voice.render

    def recorded(*args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name)
        return render(*args, **kwargs)

    monkeypatch.setattr(voice, "render", recorded)
    calibrate(voice, threads=2)
    assert len(threads) == 2
    assert (voice.context_frames, voice.flow_context_frames) == found_alone


def test_every_start_measures_the_same_gain() -> None:
    """Piper's noise is seeded at load, so a voice's gain (its loudness) is the same at every
    start and on every replica (drawn anew in each process, it varied by 1.6 dB)."""
    model, config = bundled_voice_paths()
    script = (
        "import sys; from pathlib import Path; from streamtts.piper.load import load_voice; "
        "print(repr(load_voice(Path(sys.argv[1]), Path(sys.argv[2]), onnx_threads=1).gain))"
    )
    other_process = subprocess.run(
        [sys.executable, "-c", script, str(model), str(config)],
        capture_output=True,
        text=True,
        check=True,
    )
    here = load_voice(model, config, onnx_threads=1, calibration_threads=2)
    assert float(other_process.stdout) == here.gain
