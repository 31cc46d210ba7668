"""Piper's decoder rewritten so that ONNX Runtime runs it on its blocked convolution kernels.

ONNX Runtime's CPU provider has faster convolutions for a blocked channel layout (NCHWc: the
channels in blocks of the CPU's vector width), which its optimiser (``ORT_ENABLE_ALL``, the
default level) puts in place of 2-D ``Conv`` nodes, and keeps through the operators it can run
in that layout (``Add``, ``Relu``, ``Tanh``, …); any other operator gets its input reordered
back to the plain layout, and the next convolution reorders it again. Piper's HiFi-GAN decoder,
~70% of a sentence's compute, is 1-D (``[batch, channels, frames]``), so none of it is blocked,
and a LeakyReLU before each of its convolutions would break a blocked chain anyway. Rewritten:

- every tensor on the latent input's path is 4-D with height 1 (``[batch, channels, 1,
  length]``) and each 1-D ``Conv``/``ConvTranspose`` 2-D with a kernel of height 1: the same
  sums;
- ``LeakyRelu(x)`` becomes a depthwise 1x1 convolution with weight 1 and the LeakyReLU fused as
  its activation (``FusedConv``; ``x * 1`` is ``x``), which stays blocked;
- each ``ConvTranspose`` (which has no blocked kernel) is followed by a depthwise 1x1 identity
  convolution, which takes its output into the blocked layout once for all of its users;
- a multiplication or division by a constant becomes a depthwise 1x1 convolution by the factor
  (``x * (1/d)``: within a rounding of ``x / d``);
- any other operator gets its inputs back in 3-D (``Squeeze``) and runs unchanged.

Shapes are declared with symbolic lengths (the same symbol only where a convolution provably
keeps the length, or an upsampling multiplies it), so that the optimiser can show that the two
inputs of a residual ``Add`` match and fuse the addition into the convolution before it.

The result sums in another order than the original, so it is adopted only once it has matched
the original decoder on a calibration sentence (``streamtts.piper.stages``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

MS_DOMAIN = "com.microsoft"
HEIGHT_AXIS = 2
_ELEMENTWISE = frozenset({"Relu", "Tanh", "Sigmoid", "Identity"})


@dataclass(frozen=True)
class _Region:
    """A tensor of the rewritten path: its 4-D name, channels (None: unknown) and length."""

    name: str
    channels: int | None
    length: str


@dataclass(frozen=True)
class _Conv:
    """A 1-D (transposed) convolution of the path, its weight and attributes made 2-D."""

    source: _Region
    inputs: list[str]
    attributes: dict[str, Any]
    kernel: int
    out_channels: int
    transposed_channels: int  # a transposed convolution's output channels

    @property
    def dilation(self) -> int:
        return int(self.attributes["dilations"][1])

    @property
    def stride(self) -> int:
        return int(self.attributes["strides"][1])

    @property
    def pads(self) -> int:
        return int(self.attributes["pads"][1] + self.attributes["pads"][3])


class _Rewrite:
    """One decoder's rewrite: the new nodes, initializers and shapes, built node by node."""

    def __init__(self, model: Any, latent_name: str) -> None:
        from onnx import numpy_helper

        self.model = model
        self.graph = model.graph
        self.weights = {init.name: numpy_helper.to_array(init) for init in self.graph.initializer}
        self.dims = _inferred_dims(model)
        self.region: dict[str, _Region] = {}
        self.squeezed: set[str] = set()
        self.lowered: set[str] = set()  # tensors of the path left in 3-D
        self.nodes: list[Any] = []
        self.converted = 0
        self._names = itertools.count()
        self._axes_as_input = _default_opset(model) >= 13
        self._axes = self._constant("axes", np.array([HEIGHT_AXIS], dtype=np.int64))
        self._lift(latent_name)
        self.squeezed.add(latent_name)  # a graph input: its 3-D form is there already

    def _fresh(self, stem: str) -> str:
        return f"streamtts_blocked/{stem}_{next(self._names)}"

    def _constant(self, stem: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self._fresh(stem)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def _axes_node(self, op: str, source: str, target: str) -> Any:
        from onnx import helper

        if self._axes_as_input:
            return helper.make_node(op, [source, self._axes], [target])
        return helper.make_node(op, [source], [target], axes=[HEIGHT_AXIS])

    def _lift(self, name: str) -> None:
        """The rewritten path starts at ``name`` (3-D), unsqueezed to 4-D."""
        lifted = self._fresh("latent")
        self.nodes.append(self._axes_node("Unsqueeze", name, lifted))
        self.region[name] = _Region(lifted, self._input_channels(name), "frames")

    def _input_channels(self, name: str) -> int | None:
        for node in self.graph.node:
            if node.op_type == "Conv" and node.input[0] == name:
                weight = self.weights.get(node.input[1])
                if weight is not None and weight.ndim == 3:
                    return int(weight.shape[1]) * _int_attribute(node, "group", 1)
        return None

    def add(self, node: Any) -> None:
        """``node`` rewritten if it is on the path and of a kind we rewrite, else unchanged
        (with its inputs on the path squeezed back to 3-D, and its outputs on the path in
        3-D, lifted again where a node we rewrite takes them)."""
        if not any(name in self.region or name in self.lowered for name in node.input):
            self.nodes.append(node)
            return
        for name in node.input:
            if name in self.lowered:
                self._lift_lowered(name)
        if self._convert(node):
            self.converted += 1
            return
        for name in node.input:
            self._squeeze_back(name)  # a lifted tensor's 3-D form is there already
        self.lowered.update(node.output)
        self.nodes.append(node)

    def _lift_lowered(self, name: str) -> None:
        """A 3-D tensor of the path (made by a node we did not rewrite) in 4-D too, where its
        rank is known to be 3."""
        dims = self.dims.get(name)
        if name not in self.region and dims is not None and len(dims) == 3:
            lifted = self._fresh("lifted")
            self.nodes.append(self._axes_node("Unsqueeze", name, lifted))
            self.region[name] = _Region(lifted, dims[1], self._fresh("length"))
            self.squeezed.add(name)

    def _squeeze_back(self, name: str) -> None:
        region = self.region.get(name)
        if region is not None and name not in self.squeezed:
            self.nodes.append(self._axes_node("Squeeze", region.name, name))
            self.squeezed.add(name)

    def finish(self) -> None:
        for output in self.graph.output:
            self._squeeze_back(output.name)
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        used = {name for node in self.nodes for name in node.input}
        kept = [init for init in self.graph.initializer if init.name in used]
        del self.graph.initializer[:]  # the 1-D weights that were replaced
        self.graph.initializer.extend(kept)
        self._declare_shapes()
        if not any(o.domain == MS_DOMAIN for o in self.model.opset_import):
            from onnx import helper

            self.model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))

    def _declare_shapes(self) -> None:
        from onnx import TensorProto, helper

        for index, region in enumerate(self.region.values()):
            channels: int | str = (
                region.channels if region.channels is not None else f"channels_{index}"
            )
            self.graph.value_info.append(
                helper.make_tensor_value_info(
                    region.name, TensorProto.FLOAT, ["batch", channels, 1, region.length]
                )
            )

    # -- the operators rewritten -----------------------------------------------------------

    def _convert(self, node: Any) -> bool:
        op = node.op_type
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            return False
        if not any(name in self.region for name in node.input):
            return False  # its inputs on the path are 3-D tensors that could not be lifted
        if op == "Conv":
            return self._conv(node)
        if op == "ConvTranspose":
            return self._conv_transpose(node)
        if op == "LeakyRelu":
            return self._leaky_relu(node)
        if op in ("Add", "Sum") and len(node.input) == 2:
            return self._add(node)
        if op in ("Mul", "Div"):
            return self._scale(node)
        if op in _ELEMENTWISE and len(node.input) == 1:
            source = self.region[node.input[0]]
            self._emit(node, [source.name], source.channels, source.length)
            return True
        return False

    def _emit(
        self,
        node: Any,
        inputs: list[str],
        channels: int | None,
        length: str,
        **attributes: Any,
    ) -> str:
        """``node`` on 4-D tensors: its output's 4-D name."""
        from onnx import helper

        target = self._fresh(node.op_type)
        rewritten = helper.make_node(node.op_type, inputs, [target], name=node.name)
        if attributes:
            rewritten.attribute.extend(
                helper.make_attribute(k, v) for k, v in attributes.items() if v is not None
            )
        else:
            rewritten.attribute.extend(node.attribute)
        self.nodes.append(rewritten)
        self.region[node.output[0]] = _Region(target, channels, length)
        return target

    def _static_weights(self, node: Any) -> np.ndarray | None:
        if node.input[0] not in self.region or any(n in self.region for n in node.input[1:]):
            return None
        weight = self.weights.get(node.input[1])
        if weight is None or weight.ndim != 3 or weight.dtype != np.float32:
            return None
        if len(node.input) > 2 and node.input[2] and node.input[2] not in self.weights:
            return None
        return weight

    def _conv_attributes(self, node: Any, kernel: int) -> dict[str, Any] | None:
        """The 2-D attributes of a 1-D convolution (None: an attribute we do not rewrite)."""
        attributes = node_attributes(node)
        if attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            return None
        if "output_shape" in attributes:
            return None
        pads = attributes.get("pads", [0, 0])
        return {
            "kernel_shape": [1, kernel],
            "strides": [1, *attributes.get("strides", [1])],
            "dilations": [1, *attributes.get("dilations", [1])],
            "pads": [0, pads[0], 0, pads[1]],
            "group": attributes.get("group", 1),
            "output_padding": (
                [0, *attributes["output_padding"]] if "output_padding" in attributes else None
            ),
        }

    def _lifted_conv(self, node: Any) -> _Conv | None:
        weight = self._static_weights(node)
        if weight is None:
            return None
        attributes = self._conv_attributes(node, int(weight.shape[2]))
        if attributes is None:
            return None
        lifted_weight = self._constant("weight", weight[:, :, None, :])
        return _Conv(
            source=self.region[node.input[0]],
            inputs=[self.region[node.input[0]].name, lifted_weight, *node.input[2:]],
            attributes=attributes,
            kernel=int(weight.shape[2]),
            out_channels=int(weight.shape[0]),
            transposed_channels=int(weight.shape[1]) * int(attributes["group"]),
        )

    def _conv(self, node: Any) -> bool:
        conv = self._lifted_conv(node)
        if conv is None:
            return False
        keeps_length = conv.stride == 1 and conv.pads == conv.dilation * (conv.kernel - 1)
        length = conv.source.length if keeps_length else self._fresh("length")
        self._emit(node, conv.inputs, conv.out_channels, length, **conv.attributes)
        return True

    def _conv_transpose(self, node: Any) -> bool:
        conv = self._lifted_conv(node)
        if conv is None:
            return False
        extra = (conv.attributes["output_padding"] or [0, 0])[1]
        span = conv.dilation * (conv.kernel - 1) + 1
        # Output length (L - 1)·s - pads + span + extra: L·s where span + extra = s + pads.
        upsamples = span + extra == conv.stride + conv.pads
        length = f"{conv.source.length}*{conv.stride}" if upsamples else self._fresh("length")
        channels = conv.transposed_channels
        plain = self._emit(node, conv.inputs, channels, length, **conv.attributes)
        self._depthwise(node.output[0], plain, channels, length, 1.0)
        return True

    def _depthwise(
        self,
        output: str,
        source: str,
        channels: int,
        length: str,
        factor: float,
        activation: tuple[str, float] | None = None,
    ) -> None:
        """``output`` := a depthwise 1x1 convolution of ``source`` by ``factor`` (with a fused
        activation): elementwise, in the blocked layout."""
        from onnx import helper

        weight = self._constant("depthwise", np.full((channels, 1, 1, 1), factor, np.float32))
        target = self._fresh("depthwise")
        if activation is None:
            conv = helper.make_node(
                "Conv", [source, weight], [target], group=channels, kernel_shape=[1, 1]
            )
        else:
            kind, parameter = activation
            conv = helper.make_node(
                "FusedConv",
                [source, weight],
                [target],
                domain=MS_DOMAIN,
                group=channels,
                kernel_shape=[1, 1],
                activation=kind,
                activation_params=[parameter],
            )
        self.nodes.append(conv)
        self.region[output] = _Region(target, channels, length)

    def _leaky_relu(self, node: Any) -> bool:
        source = self.region[node.input[0]]
        if source.channels is None:
            return False
        alpha = float(node_attributes(node).get("alpha", 0.01))
        self._depthwise(
            node.output[0],
            source.name,
            source.channels,
            source.length,
            1.0,
            ("LeakyRelu", alpha),
        )
        return True

    def _add(self, node: Any) -> bool:
        first, second = (self.region.get(name) for name in node.input)
        if first is None or second is None:
            return self._add_broadcast(node)
        same = first.length == second.length and first.channels == second.channels
        length = first.length if same else self._fresh("length")
        self._emit(node, [first.name, second.name], first.channels if same else None, length)
        return True

    def _add_broadcast(self, node: Any) -> bool:
        """A term from off the path (a speaker's conditioning, ``[batch, channels, 1]``) added
        to one on it: lifted to 4-D too, where its rank is known to be 3."""
        on_path, off_path = (
            (node.input[0], node.input[1])
            if node.input[0] in self.region
            else (node.input[1], node.input[0])
        )
        dims = self.dims.get(off_path)
        if dims is None or len(dims) != 3:
            return False
        lifted = self._fresh("broadcast")
        self.nodes.append(self._axes_node("Unsqueeze", off_path, lifted))
        source = self.region[on_path]
        length = source.length if dims[2] == 1 else self._fresh("length")
        self._emit(node, [source.name, lifted], source.channels, length)
        return True

    def _scale(self, node: Any) -> bool:
        """``x * c`` or ``x / c`` by a scalar constant ``c``."""
        if len(node.input) != 2:
            return False
        tensor, constant = node.input
        if node.op_type == "Mul" and tensor not in self.region:
            tensor, constant = constant, tensor
        source = self.region.get(tensor)
        value = self.weights.get(constant)
        if source is None or source.channels is None or value is None or value.size != 1:
            return False
        factor = float(value.reshape(()))
        if node.op_type == "Div":
            if factor == 0:
                return False
            factor = 1.0 / factor
        self._depthwise(node.output[0], source.name, source.channels, source.length, factor)
        return True


def blocked_decoder(decoder: Any, latent_name: str) -> Any | None:
    """A rewritten copy of ``decoder`` (an ``onnx`` ModelProto whose input ``latent_name`` is
    ``[batch, channels, frames]``), or None where nothing on that input's path was rewritten."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    rewrite = _Rewrite(model, latent_name)
    for node in list(model.graph.node):
        rewrite.add(node)
    if not rewrite.converted:
        return None
    rewrite.finish()
    return model


def _inferred_dims(model: Any) -> dict[str, list[int | None]]:
    """The dimensions ONNX's shape inference finds for the graph's tensors (None: unknown)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an unexpected graph: no shapes, so nothing off the path is lifted
        return {}
    dims: dict[str, list[int | None]] = {}
    graph = inferred.graph
    for info in [*graph.input, *graph.value_info, *graph.output]:
        tensor = info.type.tensor_type
        if tensor.HasField("shape"):
            dims[info.name] = [
                d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim
            ]
    return dims


def node_attributes(node: Any) -> dict[str, Any]:
    """An ONNX node's attributes by name, as Python values."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _int_attribute(node: Any, name: str, default: int) -> int:
    return int(node_attributes(node).get(name, default))


def _default_opset(model: Any) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)
