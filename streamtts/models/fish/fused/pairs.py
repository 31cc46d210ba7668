"""bf16 weights in the pairs layout, multiplied by ``streamtts_fused::row_linear``.

A decode step multiplies a few rows by each weight once, so each product is a read of the
weight. On a Zen 4 (2026-12-06) oneDNN's packed bf16 kernel read them at 21-28 GB/s where the
memory gives 34 or more; ``csrc/row_linear.cpp`` streams them at 32-50 GB/s with AVX512-BF16's
pairwise dot product, and for a prompt's rows (32-256) it computed as fast as oneDNN's blocked
kernel (1-8% faster). Its sums run in another order than oneDNN's, so an output can differ
from ``F.linear``'s by a bf16 step; every caller of a paired weight runs the same kernel, so
the Python code and the fused ops still agree bit for bit.

Which layers: the fast ones always (they only multiply a decode step's rows); the slow ones
where the CPU has no AMX, whose tiles make oneDNN's kernel several times faster for a prompt's
rows than this one (both layouts would double the slow layers' memory). A layer fits where its
outputs are a multiple of 64 and its inputs even: not Fish-Speech 1.5's 102 048-row text head,
which stays on oneDNN.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from streamtts.models.fish.fused.library import FusedUnavailable, load_library
from streamtts.models.fish.llm.llama import DualARTransformer
from streamtts.models.fish.packed import PackedLinear
from streamtts.models.fish.swap import replace_linears_

OUTPUTS_PER_TASK = 64  # row_linear.cpp: kOutputsPerTask


def pairs_fit(weight: torch.Tensor) -> bool:
    """Whether ``weight`` [N, K] has the pairs layout's shape: N a multiple of 64, K even."""
    n, k = weight.shape
    return weight.dtype == torch.bfloat16 and n % OUTPUTS_PER_TASK == 0 and k % 2 == 0


def pack_pairs(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] → [N/64, K/2, 64, 2]: per task of 64 outputs and input pair j, the outputs'
    (w[n, 2j], w[n, 2j+1]), contiguous."""
    n, k = weight.shape
    tasks = weight.reshape(n // OUTPUTS_PER_TASK, OUTPUTS_PER_TASK, k // 2, 2)
    return tasks.permute(0, 2, 1, 3).contiguous()


class PairedLinear(PackedLinear):
    """``y = x @ weightᵀ + bias`` with the weight in the pairs layout (:func:`pack_pairs`)."""

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        return pack_pairs(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.ops.streamtts_fused.row_linear(x, self.packed, self.bias)
        return y


def _row_linear_shape(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0] * OUTPUTS_PER_TASK)


@functools.cache
def why_not_paired() -> str | None:
    """Why the pairs layout cannot be used here (None: it can): the library and AVX512-BF16."""
    try:
        load_library()
    except FusedUnavailable as exc:
        return str(exc)
    if not torch.ops.streamtts_fused.row_linear_supported():
        return "this CPU has no AVX512-BF16"
    # The op's shape for torch.compile, which traces the Python pass through it.
    torch.library.register_fake("streamtts_fused::row_linear")(_row_linear_shape)
    return None


def slow_layers_pair() -> bool:
    """Whether the slow layers pair too: a CPU without AMX (see the module's docstring)."""
    return not torch.cpu._is_amx_tile_supported()


def pair_linears_(model: DualARTransformer, slow: bool) -> int:
    """Replace the fast layers' and the codebook head's ``nn.Linear`` of fitting shape, and
    with ``slow`` every other one's, by :class:`PairedLinear`, before the rest is packed.
    Returns how many layers are paired."""
    fast = {id(m) for m in (*model.fast_layers.modules(), model.fast_output)}

    def build(linear: nn.Linear) -> nn.Module:
        if (slow or id(linear) in fast) and pairs_fit(linear.weight):
            return PairedLinear.from_linear(linear)
        return linear

    replace_linears_(model, build)
    return sum(isinstance(m, PairedLinear) for m in model.modules())


def products(layers: nn.Module) -> str:
    """What multiplies ``layers``' weights: ``row_linear`` (the pairs layout), ``onednn``
    (packed) or ``aten`` (plain or int8 layers)."""
    modules = list(layers.modules())
    if any(isinstance(m, PairedLinear) for m in modules):
        return "row_linear"
    return "onednn" if any(isinstance(m, PackedLinear) for m in modules) else "aten"
