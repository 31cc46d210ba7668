"""How far a convolutional graph's output reaches into its input along time, in input frames.

A window of a vocoder's frames decoded with this many frames of context on each side gives the
samples that decoding all of them gives, to within float roundings: no frame further away
contributes to any sample of the window (every intermediate value the window's samples use is
itself computed from frames inside the context). Found by following the graph from its input:
a 1-D ``Conv`` reaches as far as its kernel, dilation and padding take it, at the rate of its
input; a ``ConvTranspose`` the same, into its upsampled output; elementwise operators keep
their input's reach, as do axes of length 1 added or dropped and slices, splits and
concatenations along the channels; a sum or product of branches reaches as far as its farthest
branch, and a tensor's shape (zeros as long as it) depends on no input value. Terms that do
not come from the input (a speaker's conditioning, constants) reach nothing. Any other
operator on the input's path makes the reach unknown (None).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from streamtts.piper.blocked import node_attributes

_ELEMENTWISE = frozenset({"LeakyRelu", "Relu", "Tanh", "Sigmoid", "Identity", "Neg", "Exp"})
_COMBINING = frozenset({"Add", "Sub", "Mul", "Div", "Sum"})
_SIZE_ONE_AXES = frozenset({"Unsqueeze", "Squeeze"})  # add or drop axes of length 1: no mixing
_CHANNEL_AXES = frozenset({1, -2})  # of a [batch, channels, time] tensor


@dataclass(frozen=True)
class Reach:
    """A tensor of the input's path: its samples per input frame, and the input frames before
    and after a sample's own time that it depends on."""

    rate: Fraction
    before: Fraction
    after: Fraction
    channels_at_1: bool = True  # still [batch, channels, time] (no axis added or dropped)


def receptive_frames(model: Any, input_names: list[str]) -> int | None:
    """Input frames on each side of an output sample's time that it can depend on (the larger
    side, rounded up), for an ``onnx`` ModelProto whose inputs ``input_names`` are ``[batch,
    channels, frames]`` at one rate; None where the graph has an operator this does not
    follow."""
    reaches = output_reaches(model, input_names)
    if reaches is None:
        return None
    return max(max(r.before, r.after, Fraction(0)).__ceil__() for r in reaches)


def output_reaches(model: Any, input_names: list[str]) -> list[Reach] | None:
    """The reach of each of the graph's outputs into ``input_names`` (None: not known)."""
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    weight_dims = {init.name: list(init.dims) for init in graph.initializer}
    indices = {
        init.name: [int(i) for i in numpy_helper.to_array(init).reshape(-1)]
        for init in graph.initializer
        if init.data_type == TensorProto.INT64 and len(init.dims) <= 1
    }
    reach = {name: Reach(Fraction(1), Fraction(0), Fraction(0)) for name in input_names}
    for node in graph.node:
        if not any(name in reach for name in node.input) or node.op_type == "Shape":
            continue  # off the path, or its dimensions only (for zeros of its length)
        made = _through(node, reach, weight_dims, indices)
        if made is None:
            return None
        for name in node.output:
            reach[name] = made
    outputs = [reach.get(output.name) for output in graph.output]
    known = [output for output in outputs if output is not None]
    return known if known and len(known) == len(outputs) else None


def _through(
    node: Any,
    reach: dict[str, Reach],
    weight_dims: dict[str, list[int]],
    indices: dict[str, list[int]],
) -> Reach | None:
    """The reach of ``node``'s output, from its inputs' on the path (None: unknown)."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return None
    sources = [reach[name] for name in node.input if name in reach]
    first_only = node.input[0] in reach and len(sources) == 1
    if op in _ELEMENTWISE and len(node.input) == 1:
        return sources[0]
    if op in _SIZE_ONE_AXES and first_only:
        return dataclasses.replace(sources[0], channels_at_1=False)
    joins_channels = (
        op == "Concat"
        and node_attributes(node).get("axis") in _CHANNEL_AXES
        and all(source.channels_at_1 for source in sources)
    )
    if op in _COMBINING or joins_channels:
        if len({source.rate for source in sources}) != 1:
            return None
        return Reach(
            sources[0].rate,
            max(source.before for source in sources),
            max(source.after for source in sources),
            all(source.channels_at_1 for source in sources),
        )
    if op == "Slice" and first_only and sources[0].channels_at_1:
        axes = indices.get(node.input[3]) if len(node.input) > 3 else None  # absent: all axes
        return sources[0] if axes and set(axes) <= _CHANNEL_AXES else None
    if op == "Split" and first_only and sources[0].channels_at_1:
        return sources[0] if node_attributes(node).get("axis") in _CHANNEL_AXES else None
    if op in ("Conv", "ConvTranspose") and first_only:
        return _convolved(node, reach[node.input[0]], weight_dims)
    return None  # an operator not followed, or a weight computed from the input


def _convolved(node: Any, source: Reach, weight_dims: dict[str, list[int]]) -> Reach | None:
    dims = weight_dims.get(node.input[1])
    if dims is None:
        return None
    attributes = node_attributes(node)
    if len(dims) != 3 or attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    (dilation,) = attributes.get("dilations", [1])
    (stride,) = attributes.get("strides", [1])
    begin = attributes.get("pads", [0, 0])[0]
    span = (dims[2] - 1) * dilation  # input samples between a kernel's first and last tap
    if node.op_type == "Conv":
        # Output t reads inputs t·s - begin ... t·s - begin + span.
        return Reach(
            source.rate / stride,
            source.before + Fraction(begin) / source.rate,
            source.after + Fraction(span - begin) / source.rate,
        )
    # ConvTranspose: input i adds to outputs i·s - begin ... i·s - begin + span, at s times
    # the rate.
    rate = source.rate * stride
    return Reach(
        rate,
        source.before + Fraction(span - begin) / rate,
        source.after + Fraction(begin) / rate,
    )
