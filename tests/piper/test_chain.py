"""A convolutional stage cut into links that keep their exact frames: the same output as the
stage run whole, with each link's context recomputed instead of the whole stage's."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from streamtts.piper.chain import Chained, ChainPrefix, Link, articulations, cut_chain
from streamtts.piper.engine import HEAD_FRAMES
from streamtts.piper.reach import receptive_frames
from streamtts.piper.stages import WINDOW_TOLERANCE, Sentence, StagedVoice, Stages
from tests.piper.graphs import CHANNELS, graph_of, latent_input, weight
from tests.piper.test_stages import LONG_SENTENCE, latent_of


def masked_graph() -> Any:
    """Conv k5 → × mask → Neg → a residual Conv k3 → Conv k3 dilation 2 → × mask."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Conv", ["z", "w1"], ["a"], pads=[2, 2]),
        helper.make_node("Mul", ["a", "mask"], ["b"]),
        helper.make_node("Neg", ["b"], ["c"]),
        helper.make_node("Conv", ["c", "w2"], ["d"], pads=[1, 1]),
        helper.make_node("Add", ["d", "c"], ["e"]),
        helper.make_node("Conv", ["e", "w3"], ["f"], pads=[2, 2], dilations=[2]),
        helper.make_node("Mul", ["f", "mask"], ["out"]),
    ]
    kernels = {"w1": 5, "w2": 3, "w3": 3}
    weights = {name: weight(rng, CHANNELS, CHANNELS, k) for name, k in kernels.items()}
    return graph_of(nodes, weights, [latent_input(), latent_input("mask", channels=1)])


def session(model: Any) -> Any:
    return onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )


def run_link(link: Link[Any], feeds: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(link.part.run(None, feeds)[0])


def test_cuts_are_where_every_path_passes_and_links_reach_some_frames() -> None:
    """Not inside the residual (two tensors live there); the mask, an elementwise Neg and the
    final mask reach nothing, so they join a neighbouring link."""
    model = masked_graph()
    assert articulations(model.graph, "z") == ["a", "b", "c", "e", "f"]
    links = cut_chain(model, "z", windowed=["mask"])
    assert links is not None
    assert [(link.input_name, link.output_name, link.reach_frames) for link in links] == [
        ("z", "a", 2),
        ("a", "e", 1),
        ("e", "out", 2),
    ]


@pytest.mark.parametrize("needs", [[12, 40], [1, 2, 3, 40], [40], [5, 5, 30, 40]])
def test_a_chain_extended_window_by_window_is_the_graph_run_whole(needs: list[int]) -> None:
    model = masked_graph()
    links = cut_chain(model, "z", windowed=["mask"])
    assert links is not None
    sessions = tuple(link.map(session) for link in links)
    rng = np.random.default_rng(6)
    latent = rng.normal(size=(1, CHANNELS, 40)).astype(np.float32)
    mask = np.ones((1, 1, 40), np.float32)
    (whole,) = session(model).run(None, {"z": latent, "mask": mask})
    prefix = ChainPrefix(sessions, latent, {"mask": mask}, {})
    for need in needs:
        made = prefix.through(need, run_link)
        assert made.shape[-1] >= need
        np.testing.assert_allclose(made, whole[:, :, : made.shape[-1]], rtol=0, atol=1e-5)
    assert prefix.exact_frames[-1] == 40


def test_a_graph_with_an_operator_it_does_not_follow_is_not_cut() -> None:
    nodes = [
        helper.make_node("Conv", ["z", "w"], ["a"], pads=[1, 1]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1]),
        helper.make_node("Transpose", ["b"], ["out"], perm=[0, 2, 1]),
    ]
    weights = {"w": weight(np.random.default_rng(7), CHANNELS, CHANNELS, 3)}
    model = graph_of(nodes, weights, [latent_input()])
    assert cut_chain(model, "z") is None
    single = graph_of(nodes[:1], weights, [latent_input()])
    single.graph.node[0].output[0] = "out"
    assert cut_chain(single, "z") is None  # one link is no chain


def test_a_chained_voice_makes_whole_sentences_through_its_links(
    voice: StagedVoice, split: Stages[Any]
) -> None:
    """Once chained, the flow's own session is not kept (the links hold its weights again):
    whole sentences run through the links one after another, to the flow's frames."""
    stages = voice._stages
    assert stages is not None and isinstance(stages.flow, Chained)
    assert stages.flow.links == stages.flow_links
    sentence = latent_of(voice, LONG_SENTENCE)
    total = voice.frames(sentence)
    through_links = voice._latent(sentence, 0, total, None)
    prior, mask = sentence.arrays
    assert split.flow is not None
    (whole,) = session(split.flow).run(
        None, dict(zip(split.prior_names, (prior, mask), strict=True))
    )
    assert through_links.shape == whole.shape == (1, 192, total)
    tolerance = WINDOW_TOLERANCE * np.abs(whole).max()
    np.testing.assert_allclose(through_links, whole, rtol=0, atol=tolerance)


def test_the_bundled_flow_is_cut_between_its_four_couplings(split: Stages[Any]) -> None:
    assert split.flow is not None
    reaches = [link.reach_frames for link in split.flow_links]
    assert reaches == [8, 8, 8, 8]
    assert sum(reaches) == receptive_frames(split.flow, list(split.prior_names))
    assert split.flow_links[0].input_name == split.prior_names[0]
    assert split.flow_links[-1].output_name == split.latent_name
    for link in split.flow_links:
        inputs = [i.name for i in link.part.graph.input]
        assert inputs == [link.input_name, split.prior_names[1]]
        assert link.part.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_a_first_window_and_the_rest_run_each_coupling_over_its_own_context_only(
    voice: StagedVoice,
) -> None:
    """Made as the engine makes a listener's first sentence (a first window with the
    decoder's context, then the rest), the flow runs 4 × T + 64 frames through couplings
    where windows with the whole flow's context ran 4 × (76 + T); and makes the same frames."""
    assert voice.flow_chained and voice.context_frames == 12
    sentence = latent_of(voice, LONG_SENTENCE)
    total = voice.frames(sentence)
    whole = voice._latent(Sentence(sentence.arrays), 0, total, None)
    head = voice._latent(sentence, 0, HEAD_FRAMES + 12, 32)
    rest = voice._latent(sentence, HEAD_FRAMES - 12, total, 32)
    tolerance = WINDOW_TOLERANCE * np.abs(whole).max()
    np.testing.assert_allclose(head, whole[:, :, : HEAD_FRAMES + 12], rtol=0, atol=tolerance)
    np.testing.assert_allclose(rest, whole[:, :, HEAD_FRAMES - 12 :], rtol=0, atol=tolerance)
    assert sentence.flow_prefix is not None
    # First window: 44 + 32 frames into the first coupling, 8 fewer into each next one;
    # the rest: from 8 frames before where each coupling's exact frames stopped.
    assert sentence.flow_prefix.frames_run == (76 + 68 + 60 + 52) + (4 * total - 192)
    assert sentence.flow_prefix.frames_run < 4 * (76 + total)


class _Failing:
    def run(self, *_: Any) -> list[np.ndarray]:
        raise RuntimeError("an unexpected graph")


@pytest.mark.parametrize("broken", ["too_little_reach", "a_link_that_fails"])
def test_links_that_do_not_make_the_flow_s_frames_are_not_chained(
    voice: StagedVoice, broken: str
) -> None:
    """The check at load can fail: with each coupling's context cut to 1 frame the chain makes
    other frames, and a link that raises cannot run; either way the voice keeps running the
    flow's windows with all their context."""
    stages = voice._stages
    assert stages is not None and voice.flow_chained
    if broken == "too_little_reach":
        links = tuple(dataclasses.replace(link, reach_frames=1) for link in stages.flow_links)
    else:
        links = (
            *stages.flow_links[:-1],
            dataclasses.replace(stages.flow_links[-1], part=_Failing()),
        )
    sentence = latent_of(voice, LONG_SENTENCE)
    try:
        voice._stages = dataclasses.replace(stages, flow_links=links)
        assert not voice.chain_flow(sentence)
        assert not voice.flow_chained
        total = voice.frames(sentence)
        windows = [voice.render(sentence, 0, HEAD_FRAMES), voice.render(sentence, HEAD_FRAMES)]
        whole = voice.render(sentence)
        tolerance = WINDOW_TOLERANCE * np.abs(whole).max()
        np.testing.assert_allclose(np.concatenate(windows), whole, rtol=0, atol=tolerance)
        assert sentence.flow_prefix is None and total > HEAD_FRAMES
    finally:
        voice._stages = stages
        voice.flow_chained = True
