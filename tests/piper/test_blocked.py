"""Piper's decoder rewritten for ONNX Runtime's blocked kernels: the same audio, blocked
convolutions, and everything it does not rewrite still running as before."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamtts.piper.blocked import blocked_decoder
from streamtts.piper.engine import bundled_voice_paths
from streamtts.piper.load import load_voice
from streamtts.piper.stages import WINDOW_TOLERANCE, StagedVoice, Stages

NCHWC_DOMAIN = "com.microsoft.nchwc"
SENTENCE = "The weather today is sunny with a light breeze from the west, and mild."


def session(model: Any, optimized: Path | None = None) -> Any:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return onnxruntime.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )


@pytest.fixture(scope="module")
def plain_voice() -> StagedVoice:
    model, config = bundled_voice_paths()
    return load_voice(model, config, onnx_threads=1, blocked=False)


def latent_frames(voice: StagedVoice, frames: int) -> np.ndarray:
    (ids,) = voice.phoneme_ids(SENTENCE)
    sentence = voice.sentence(ids, voice.scales(1.0))
    latent = voice._latent(sentence, 0, voice.frames(sentence), None)
    assert latent.shape[-1] >= frames
    return latent[:, :, :frames]


def blocks_convolutions() -> bool:
    """Whether ONNX Runtime on this CPU puts a plain 2-D convolution on blocked kernels."""
    weight = numpy_helper.from_array(np.ones((16, 16, 1, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[0, 1, 0, 1])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 1, 8])],
        [weight],
    )
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    with tempfile.TemporaryDirectory() as folder:
        optimized = onnx.load(str(_optimized_to(probe, Path(folder) / "probe.onnx")))
    return any(node.domain == NCHWC_DOMAIN for node in optimized.graph.node)


def test_the_bundled_decoder_rewritten_makes_the_same_audio(
    split: Stages[Any], plain_voice: StagedVoice
) -> None:
    rewritten = blocked_decoder(split.decoder, split.latent_name)
    assert rewritten is not None
    exported, blocked = session(split.decoder), session(rewritten)
    tolerance = 0.0
    for frames in (200, 48, 7, 1):  # to a fraction of the sentence's peak, as windows are
        latent = latent_frames(plain_voice, frames)
        (reference,) = exported.run(None, {split.latent_name: latent})
        (made,) = blocked.run(None, {split.latent_name: latent})
        assert made.shape == reference.shape
        tolerance = tolerance or WINDOW_TOLERANCE * float(np.abs(reference).max())
        np.testing.assert_allclose(made, reference, rtol=0, atol=tolerance)


def test_onnx_runtime_runs_the_rewritten_decoder_on_blocked_kernels(
    split: Stages[Any], tmp_path: Path
) -> None:
    if not blocks_convolutions():
        pytest.skip("ONNX Runtime has no blocked convolutions on this CPU")
    rewritten = blocked_decoder(split.decoder, split.latent_name)
    assert rewritten is not None
    convolutions = sum(n.op_type == "Conv" for n in split.decoder.graph.node)
    upsamplings = sum(n.op_type == "ConvTranspose" for n in split.decoder.graph.node)
    exported = onnx.load(str(_optimized_to(split.decoder, tmp_path / "exported.onnx")))
    assert not [n for n in exported.graph.node if n.domain == NCHWC_DOMAIN]
    optimized = onnx.load(str(_optimized_to(rewritten, tmp_path / "blocked.onnx")))
    blocked = [n for n in optimized.graph.node if n.domain == NCHWC_DOMAIN]
    assert sum(n.op_type == "Conv" for n in blocked) >= convolutions
    # The layout changes only around the upsamplings (no blocked kernel) and the ends:
    # not around every convolution, as a LeakyReLU or a plain Add between them would force.
    reorders = [n for n in blocked if n.op_type.startswith("Reorder")]
    assert len(reorders) <= 2 * upsamplings + 2


def _optimized_to(model: Any, path: Path) -> Path:
    session(model, path)
    return path


def conv_weight(rng: np.random.Generator, out: int, inp: int, kernel: int) -> np.ndarray:
    return rng.normal(scale=0.3, size=(out, inp, kernel)).astype(np.float32)


def test_what_it_does_not_rewrite_runs_on_3d_tensors_as_before() -> None:
    """An operator it has no rewrite for (``Sin``), an ``Add`` of a broadcast term from off
    the latent's path (a speaker's conditioning), scaling and an upsampling, in one graph."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(conv_weight(rng, 16, 8, 3), "w1"),
        numpy_helper.from_array(conv_weight(rng, 16, 16, 4), "wt"),
        numpy_helper.from_array(conv_weight(rng, 8, 16, 5), "w2"),
        numpy_helper.from_array(np.array(4.0, np.float32), "four"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("Conv", ["z", "w1"], ["a"], pads=[1, 1]),
        helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.1),
        helper.make_node("Sin", ["b"], ["c"]),
        helper.make_node("Add", ["c", "speaker"], ["d"]),
        helper.make_node("Div", ["d", "four"], ["e"]),
        helper.make_node("ConvTranspose", ["e", "wt"], ["f"], strides=[2], pads=[1, 1]),
        helper.make_node("Mul", ["half", "f"], ["g"]),
        helper.make_node("Conv", ["g", "w2"], ["h"], pads=[4, 4], dilations=[2]),
        helper.make_node("Tanh", ["h"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder-like",
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, "frames"]),
            helper.make_tensor_value_info("speaker", TensorProto.FLOAT, [1, 16, 1]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, "samples"])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    rewritten = blocked_decoder(model, "z")
    assert rewritten is not None
    onnx.checker.check_model(rewritten)
    kinds = [n.op_type for n in rewritten.graph.node]
    assert "Sin" in kinds and "Squeeze" in kinds  # back to 3-D for it, and for the output
    assert "LeakyRelu" not in kinds and "Div" not in kinds and "Mul" not in kinds
    feeds = {
        "z": rng.normal(size=(1, 8, 37)).astype(np.float32),
        "speaker": rng.normal(size=(1, 16, 1)).astype(np.float32),
    }
    (reference,) = session(model).run(None, feeds)
    (made,) = session(rewritten).run(None, feeds)
    assert made.shape == reference.shape == (1, 8, 74)
    np.testing.assert_allclose(made, reference, rtol=0, atol=1e-5)


def test_a_graph_with_nothing_to_rewrite_is_left_alone() -> None:
    graph = helper.make_graph(
        [helper.make_node("Sin", ["z"], ["out"])],
        "no-convolutions",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    assert blocked_decoder(model, "z") is None


class _Louder:
    """A decoder that makes the audio 1% louder than the one it wraps."""

    def __init__(self, decoder: Any) -> None:
        self._decoder = decoder

    def run(self, outputs: Any, feeds: dict[str, np.ndarray], *options: Any) -> list[Any]:
        return [1.01 * np.asarray(self._decoder.run(outputs, feeds, *options)[0])]


def test_a_voice_adopts_a_rewritten_decoder_only_if_it_makes_the_same_audio(
    split: Stages[Any], plain_voice: StagedVoice
) -> None:
    assert not plain_voice.decodes_blocked
    exported = session(split.decoder)
    assert not plain_voice.adopt_decoder(_Louder(exported))
    assert not plain_voice.decodes_blocked
    rewritten = blocked_decoder(split.decoder, split.latent_name)
    assert rewritten is not None
    assert plain_voice.adopt_decoder(session(rewritten))
    assert plain_voice.decodes_blocked


def test_a_tensor_of_unknown_rank_on_the_path_stays_as_it_is() -> None:
    """An operator whose output's rank shape inference cannot tell (a reshape to a shape given
    at run time) leaves the path in 3-D: what follows it runs unchanged, not rewritten."""
    rng = np.random.default_rng(1)
    weights = [
        numpy_helper.from_array(conv_weight(rng, 16, 8, 3), "w1"),
        numpy_helper.from_array(conv_weight(rng, 8, 16, 3), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["z", "w1"], ["a"], pads=[1, 1]),
        helper.make_node("Reshape", ["a", "shape"], ["b"]),
        helper.make_node("LeakyRelu", ["b"], ["c"], alpha=0.1),
        helper.make_node("Conv", ["c", "w2"], ["out"], pads=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "unknown-rank",
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, "frames"]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, ["rank"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, "frames"])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    rewritten = blocked_decoder(model, "z")
    assert rewritten is not None  # the first convolution is
    kinds = [n.op_type for n in rewritten.graph.node]
    assert kinds.count("LeakyRelu") == 1 and kinds.count("Conv") == 2  # the rest as it was
    feeds = {
        "z": rng.normal(size=(1, 8, 21)).astype(np.float32),
        "shape": np.array([1, 16, 21], np.int64),
    }
    (reference,) = session(model).run(None, feeds)
    (made,) = session(rewritten).run(None, feeds)
    np.testing.assert_allclose(made, reference, rtol=0, atol=1e-5)
