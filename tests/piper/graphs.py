"""Small ONNX graphs along time, for the Piper tests of graph analysis (reach, chains)."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

CHANNELS = 4


def graph_of(nodes: list[Any], weights: dict[str, np.ndarray], inputs: list[Any]) -> Any:
    """A model of ``nodes`` with the given weights and inputs and one output, ``out``."""
    graph = helper.make_graph(
        nodes,
        "reach",
        inputs,
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, name) for name, w in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def weight(rng: np.random.Generator, out: int, inp: int, kernel: int) -> np.ndarray:
    return rng.normal(size=(out, inp, kernel)).astype(np.float32)


def latent_input(name: str = "z", channels: int = CHANNELS) -> Any:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, channels, "frames"])
