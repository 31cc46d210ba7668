"""A convolutional graph's reach into its input: exact where it is known, unknown otherwise."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import onnxruntime
from onnx import TensorProto, helper

from streamtts.piper.reach import Reach, output_reaches, receptive_frames
from streamtts.piper.stages import StagedVoice, Stages
from tests.piper.graphs import CHANNELS, graph_of, latent_input, weight


def upsampling_graph() -> Any:
    """Conv k5 → LeakyReLU → ConvTranspose k4 s2 → Conv k3 dilation 2, a residual sum of the
    last two, and a speaker's term from off the path."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["z", "w1"], ["a"], pads=[2, 2]),
        helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.1),
        helper.make_node("ConvTranspose", ["b", "wt"], ["c"], strides=[2], pads=[1, 1]),
        helper.make_node("Add", ["c", "speaker"], ["d"]),
        helper.make_node("Conv", ["d", "w2"], ["e"], pads=[2, 2], dilations=[2]),
        helper.make_node("Add", ["e", "d"], ["out"]),
    ]
    weights = {
        "w1": weight(rng, CHANNELS, CHANNELS, 5),
        "wt": weight(rng, CHANNELS, CHANNELS, 4),  # ConvTranspose: [in, out, k]
        "w2": weight(rng, CHANNELS, CHANNELS, 3),
    }
    speaker = helper.make_tensor_value_info("speaker", TensorProto.FLOAT, [1, CHANNELS, 1])
    return graph_of(nodes, weights, [latent_input(), speaker])


def test_the_reach_is_where_a_change_of_one_input_frame_shows() -> None:
    """Before: 2 (Conv k5) + 2/2 ((k-1-pad)/s of the upsampling, in input frames) + 2/2 (the
    dilated Conv at rate 2); after: 2 + 1/2 + 2/2. A change of input frame f moves exactly the
    output samples that reach it: at rate 2, samples 2f - 7 through 2f + 8."""
    model = upsampling_graph()
    assert output_reaches(model, ["z"]) == [Reach(Fraction(2), Fraction(4), Fraction(7, 2))]
    assert receptive_frames(model, ["z"]) == 4
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(1)
    feeds = {
        "z": rng.normal(size=(1, CHANNELS, 40)).astype(np.float32),
        "speaker": rng.normal(size=(1, CHANNELS, 1)).astype(np.float32),
    }
    (before,) = session.run(None, feeds)
    frame = 20
    feeds["z"][:, :, frame] += 1.0
    (after,) = session.run(None, feeds)
    moved = np.flatnonzero(np.abs(after - before).max(axis=(0, 1)) > 1e-6)
    assert moved.tolist() == list(range(2 * frame - 7, 2 * frame + 9))


def test_an_operator_it_does_not_follow_makes_the_reach_unknown() -> None:
    """A reshape may mix time with channels: nothing is assumed past it."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["z", "w"], ["a"], pads=[1, 1]),
        helper.make_node("Reshape", ["a", "shape"], ["out"]),
    ]
    weights = {"w": weight(rng, CHANNELS, CHANNELS, 3), "shape": np.array([1, -1], np.int64)}
    model = graph_of(nodes, weights, [latent_input()])
    assert output_reaches(model, ["z"]) is None and receptive_frames(model, ["z"]) is None


def test_a_weight_computed_from_the_input_is_not_followed() -> None:
    nodes = [helper.make_node("Conv", ["z", "z"], ["out"])]
    assert receptive_frames(graph_of(nodes, {}, [latent_input()]), ["z"]) is None


def coupling_graph(slice_axis: int = 1, concat_axis: int = 1) -> Any:
    """A flow's coupling, reduced: split the channels, flip one half (a slice with step -1),
    add zeros as long as the other half (``Shape`` → ``ConstantOfShape``), convolve, join."""
    rng = np.random.default_rng(3)
    half = CHANNELS // 2
    nodes = [
        helper.make_node("Split", ["z", "halves"], ["a", "b"], axis=1),
        helper.make_node("Slice", ["b", "start", "stop", "axes", "step"], ["flipped"]),
        helper.make_node("Shape", ["a"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
        helper.make_node("Add", ["flipped", "zeros"], ["c"]),
        helper.make_node("Conv", ["c", "w"], ["d"], pads=[3, 3]),
        helper.make_node("Concat", ["a", "d"], ["out"], axis=concat_axis),
    ]
    weights = {
        "halves": np.array([half, half], np.int64),
        "start": np.array([-1], np.int64),
        "stop": np.array([np.iinfo(np.int64).min], np.int64),
        "axes": np.array([slice_axis], np.int64),
        "step": np.array([-1], np.int64),
        "w": weight(rng, half, half, 7),
    }
    return graph_of(nodes, weights, [latent_input()])


def test_channel_slices_splits_and_joins_keep_the_reach() -> None:
    model = coupling_graph()
    assert output_reaches(model, ["z"]) == [Reach(Fraction(1), Fraction(3), Fraction(3))]
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    latent = np.random.default_rng(4).normal(size=(1, CHANNELS, 30)).astype(np.float32)
    (before,) = session.run(None, {"z": latent})
    latent[:, :, 10] += 1.0
    (after,) = session.run(None, {"z": latent})
    moved = np.flatnonzero(np.abs(after - before).max(axis=(0, 1)) > 1e-6)
    assert moved.tolist() == list(range(7, 14))


def test_slices_and_joins_along_time_make_the_reach_unknown() -> None:
    assert receptive_frames(coupling_graph(slice_axis=2), ["z"]) is None
    assert receptive_frames(coupling_graph(concat_axis=2), ["z"]) is None


def test_the_bundled_flow_reaches_32_frames_and_runs_windows_with_that_context(
    split: Stages[Any], voice: StagedVoice
) -> None:
    """Four couplings of four kernel-5 layers: 4 × 4 × 2 frames; its prior and its mask are
    both windowed."""
    assert split.flow is not None
    assert receptive_frames(split.flow, list(split.prior_names)) == 32
    assert voice.flow_reach_frames == 32 and voice.flow_context_frames == 32


def test_the_bundled_decoder_reaches_12_frames_and_decodes_with_that_context(
    split: Stages[Any], voice: StagedVoice
) -> None:
    """conv_pre 3 frames, the first upsampling 11/8, the dilated blocks after it 45/8, and less
    than a frame from all of the rest: 11.08 frames before, 10.08 after. The voice decodes
    windows with that context (the windows matched it whole at load)."""
    assert receptive_frames(split.decoder, [split.latent_name]) == 12
    assert voice.decoder_reach_frames == 12 and voice.context_frames == 12
