"""A convolutional stage cut into a chain of links, each keeping the exact start of its output.

Piper's flow is four couplings in a row, each reaching 8 frames to either side, so a window of
latent frames needs 32 frames of context on each side. A sentence made as a first window and
then the rest ran the flow over the first window's frames and their context twice. Cut at the
tensors between the couplings, each link keeps the frames of its output that are exact (computed
with the link's own context on each side, or up to the sentence's edges); a later window extends
each link from where it stopped and recomputes only that link's context (8 frames, not 32).

The cuts are the tensors that every path from the stage's input to its output goes through
(:func:`articulations`); a cut whose link would reach no frames (a flip of the channels) is not
made, its nodes join the next link. Each link's reach is read from its graph (:mod:`reach`).
Runs are in frames of the stage's input: every link here keeps the input's rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from streamtts.piper.reach import receptive_frames

Part = TypeVar("Part")
Other = TypeVar("Other")


@dataclass(frozen=True)
class Link(Generic[Part]):
    """One link: ``input_name`` (and the stage's side inputs) to ``output_name``."""

    part: Part  # an ``onnx`` ModelProto, or its ONNX Runtime session
    input_name: str
    output_name: str
    reach_frames: int  # frames on each side of an output frame that it depends on (> 0)

    def map(self, make: Callable[[Part], Other]) -> Link[Other]:
        return Link(make(self.part), self.input_name, self.output_name, self.reach_frames)


def articulations(graph: Any, source: str) -> list[str]:
    """The tensors that every path from ``source`` to the graph's outputs goes through, in the
    graph's order (ONNX keeps nodes topologically sorted): after each node, the tensors that
    depend on ``source`` and are still to be read; where that is one tensor, it is a cut."""
    nodes = list(graph.node)
    outputs = {output.name for output in graph.output}
    last_read = {name: index for index, node in enumerate(nodes) for name in node.input}
    last_read.update({name: len(nodes) for name in outputs})
    dependent, live, cuts = {source}, {source}, []
    for index, node in enumerate(nodes):
        if any(name in dependent for name in node.input):
            dependent.update(node.output)
            live.update(node.output)
        live = {name for name in live if last_read.get(name, -1) > index}
        if len(live) == 1:
            (only,) = live
            if only not in outputs and only != source and only not in cuts:
                cuts.append(only)
    return cuts


def cut_chain(
    model: Any, source: str, windowed: Sequence[str] = (), fixed: Sequence[str] = ()
) -> tuple[Link[Any], ...] | None:
    """``model`` (one output) cut into links of known reach: at least two, or None.

    ``windowed``: side inputs sliced like ``source`` (a mask of its frames); ``fixed``: side
    inputs fed whole (a speaker id). Every link takes all of them."""
    import onnx.shape_inference
    import onnx.utils

    if len(model.graph.output) != 1:
        return None
    output = model.graph.output[0].name
    # The extractor types the links' inputs from the graph's value infos: infer any missing.
    extractor = onnx.utils.Extractor(onnx.shape_inference.infer_shapes(model))
    sides = [*windowed, *fixed]
    links: list[Link[Any]] = []
    start = source
    for cut in [*articulations(model.graph, source), output]:
        part = extractor.extract_model([start, *sides], [cut])
        reach = receptive_frames(part, [start, *windowed])
        if reach is None:
            return None
        if reach > 0:
            links.append(Link(part, start, cut, reach))
            start = cut
        elif cut == output and links:  # a tail that reaches nothing (a mask) joins the last link
            last = links[-1]
            joined = extractor.extract_model([last.input_name, *sides], [output])
            links[-1] = dataclasses.replace(last, part=joined, output_name=output)
    return tuple(links) if len(links) >= 2 and links[-1].output_name == output else None


RunLink = Callable[[Link[Any], dict[str, np.ndarray]], np.ndarray]


class Chained:
    """A chain's links run one after another over the same frames: what the stage they were
    cut from makes, with an ONNX Runtime session's ``run`` (so the stage's own session, which
    holds the same weights again, need not be kept)."""

    def __init__(self, links: Sequence[Link[Any]]) -> None:
        self.links = tuple(links)

    def run(
        self, output_names: Any, feeds: Mapping[str, np.ndarray], run_options: Any = None
    ) -> list[np.ndarray]:
        source = self.links[0].input_name
        sides = {name: value for name, value in feeds.items() if name != source}
        made = feeds[source]
        for link in self.links:
            made = link.part.run(None, {link.input_name: made, **sides}, run_options)[0]
        return [made]


class ChainPrefix:
    """One sentence through a chain: each link's output frames ``[0, exact)`` as far as made.

    ``source``: the stage's input ``[1, channels, frames]``; ``windowed``: side inputs of the
    same frames; ``fixed``: side inputs fed whole. Not thread-safe: a sentence is made by one
    job at a time."""

    def __init__(
        self,
        links: Sequence[Link[Any]],
        source: np.ndarray,
        windowed: Mapping[str, np.ndarray],
        fixed: Mapping[str, np.ndarray],
    ) -> None:
        self._links = links
        self._source = source
        self._windowed = windowed
        self._fixed = fixed
        self.frames = int(source.shape[-1])
        self._made: list[np.ndarray | None] = [None] * len(links)  # [1, C_k, exact_k] each
        self.exact_frames = [0] * len(links)
        self.frames_run = 0  # input frames run through links so far (all links together)

    def through(self, need_frames: int, run: RunLink) -> np.ndarray:
        """The chain's output, exact on frames ``[0, need_frames)`` at least (capped at the
        sentence's length): what earlier calls made and what this one adds."""
        last = len(self._links) - 1
        self._extend(last, min(need_frames, self.frames), run)
        made = self._made[last]
        assert made is not None
        return made

    def _extend(self, index: int, need: int, run: RunLink) -> None:
        have = self.exact_frames[index]
        if have >= need:
            return
        link = self._links[index]
        start, stop = max(0, have - link.reach_frames), min(self.frames, need + link.reach_frames)
        source: np.ndarray | None = self._source
        if index > 0:
            self._extend(index - 1, stop, run)
            source = self._made[index - 1]
        assert source is not None
        feeds = {link.input_name: source[:, :, start:stop]}
        feeds.update({name: array[:, :, start:stop] for name, array in self._windowed.items()})
        feeds.update(self._fixed)
        made = run(link, feeds)  # [1, C, stop - start]
        if made.shape[-1] != stop - start:
            raise RuntimeError(f"a link made {made.shape[-1]} frames of {stop - start}")
        self.frames_run += stop - start
        # Exact up to its reach before the window's end, or to the sentence's end.
        end = stop if stop == self.frames else stop - link.reach_frames
        added = made[:, :, have - start : end - start]
        before = self._made[index]
        self._made[index] = added if before is None else np.concatenate([before, added], axis=-1)
        self.exact_frames[index] = end
