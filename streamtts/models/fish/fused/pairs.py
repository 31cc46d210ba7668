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
inputs are even and its outputs a multiple of 64. A head's outputs need not be: its weight is
padded with zero rows to whole tasks, and the padding's outputs dropped. Fish-Speech 1.5's
102 048-row text head is 1594.5 tasks; on the Zen 4 one row took 3.6-3.7 ms through it this way
against oneDNN's 6.3-6.5 (2026-12-06, 58-62 GB/s).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from streamtts.models.fish.fused.arena import arena_slices
from streamtts.models.fish.fused.library import FusedUnavailable, load_library
from streamtts.models.fish.llm.llama import Attention, DualARTransformer
from streamtts.models.fish.packed import PackedLinear
from streamtts.models.fish.swap import replace_linears_

OUTPUTS_PER_TASK = 64  # row_linear.cpp: kOutputsPerTask


def pairs_fit(weight: torch.Tensor, head: bool = False) -> bool:
    """Whether ``weight`` [N, K] can take the pairs layout: bf16, K even, and N a multiple of 64
    unless it is a ``head`` (the fused ops drop only a head's padding: ``csrc/packed_ops.h``)."""
    n, k = weight.shape
    return weight.dtype == torch.bfloat16 and k % 2 == 0 and (head or n % OUTPUTS_PER_TASK == 0)


def padded_outputs(out_features: int) -> int:
    """A layer's outputs in the pairs layout: rounded up to whole tasks of 64."""
    return -(-out_features // OUTPUTS_PER_TASK) * OUTPUTS_PER_TASK


def pairs_shape(weight: torch.Tensor) -> tuple[int, int, int, int]:
    """The shape :func:`pack_pairs` gives ``weight`` [N, K]: [⌈N/64⌉, K/2, 64, 2]."""
    n, k = weight.shape
    return padded_outputs(n) // OUTPUTS_PER_TASK, k // 2, OUTPUTS_PER_TASK, 2


def pack_pairs(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, K] → [⌈N/64⌉, K/2, 64, 2]: per task of 64 outputs and input pair j, the outputs'
    (w[n, 2j], w[n, 2j+1]), contiguous; outputs beyond N (the last task's padding) weigh 0.
    Written into ``out`` (contiguous, of :func:`pairs_shape`) where given."""
    n, k = weight.shape
    shape = pairs_shape(weight)
    tasks = shape[0]
    full = n // OUTPUTS_PER_TASK  # tasks without padding
    if out is None:
        out = weight.new_empty(shape)
    if out.shape != shape or not out.is_contiguous() or out.dtype != weight.dtype:
        raise ValueError(f"pack_pairs: out must be contiguous {weight.dtype} {shape}")
    rows = weight[: full * OUTPUTS_PER_TASK].reshape(full, OUTPUTS_PER_TASK, k // 2, 2)
    out[:full].copy_(rows.permute(0, 2, 1, 3))
    if full < tasks:
        last = weight.new_zeros(OUTPUTS_PER_TASK, k)
        last[: n - full * OUTPUTS_PER_TASK] = weight[full * OUTPUTS_PER_TASK :]
        out[full].copy_(last.reshape(OUTPUTS_PER_TASK, k // 2, 2).permute(1, 0, 2))
    return out


class PairedLinear(PackedLinear):
    """``y = x @ weightᵀ + bias`` with the weight in the pairs layout (:func:`pack_pairs`). The
    bias, if any, is padded as the weight is, so the fused ops pass it to the kernel as it is."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        into: torch.Tensor | None = None,
    ) -> None:
        """``into``: where the packed weight goes (a slice of :func:`arena.arena_slices`; None:
        a tensor of its own)."""
        padding = padded_outputs(weight.shape[0]) - weight.shape[0]
        if bias is not None and padding:
            bias = torch.cat([bias.detach(), bias.new_zeros(padding)])
        super().__init__(weight, bias, pack_pairs(weight.detach(), into))

    @classmethod
    def into_slice(cls, linear: nn.Linear, into: torch.Tensor) -> PairedLinear:
        return cls(linear.weight, linear.bias, into)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.ops.streamtts_fused.row_linear(x, self.packed, self.bias)
        if y.shape[-1] != self.out_features:  # the last task's padding: csrc/packed_ops.h drops
            y = y[..., : self.out_features].contiguous()  # it the same way
        return y


def _row_linear_shape(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0] * OUTPUTS_PER_TASK)


def _attention_shape(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: int, scale: float
) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


@functools.cache
def why_not_paired() -> str | None:
    """Why the pairs layout cannot be used here (None: it can): the library and AVX512-BF16.
    The bf16 vocoder's ``row_conv`` needs the same (``csrc/bf16x16.h``: ``avx512_bf16``)."""
    try:
        load_library()
    except FusedUnavailable as exc:
        return str(exc)
    if not torch.ops.streamtts_fused.row_linear_supported():
        return "this CPU has no AVX512-BF16"
    # The ops' shapes for torch.compile, which traces the Python pass through them.
    torch.library.register_fake("streamtts_fused::row_linear")(_row_linear_shape)
    torch.library.register_fake("streamtts_fused::position_attention")(_attention_shape)
    return None


def slow_layers_pair() -> bool:
    """Whether the slow layers pair too: a CPU without AMX (see the module's docstring)."""
    return not torch.cpu._is_amx_tile_supported()


def pair_linears_(model: DualARTransformer, slow: bool) -> int:
    """Replace the fast layers' and the codebook head's ``nn.Linear`` of fitting shape, and
    with ``slow`` every other one's, by :class:`PairedLinear`, before the rest is packed.
    The paired weights lie end to end in one buffer on huge pages, in the model's order
    (:mod:`streamtts.models.fish.fused.arena`). Returns how many layers are paired."""
    fast = {id(m) for m in (*model.fast_layers.modules(), model.fast_output)}
    heads = {id(model.output), id(model.fast_output)}
    chosen = [
        m
        for m in model.modules()
        if isinstance(m, nn.Linear)
        and (slow or id(m) in fast)
        and pairs_fit(m.weight, id(m) in heads)
    ]
    if not chosen:
        return 0
    shapes = [pairs_shape(m.weight) for m in chosen]
    weight = chosen[0].weight
    slices = dict(
        zip(map(id, chosen), arena_slices(shapes, weight.dtype, weight.device), strict=True)
    )

    def build(linear: nn.Linear) -> nn.Module:
        into = slices.get(id(linear))
        return linear if into is None else PairedLinear.into_slice(linear, into)

    replace_linears_(model, build)
    for attention in model.fast_layers.modules():  # the codebook pass's, in every pass
        if isinstance(attention, Attention):
            attention.own_kernel = isinstance(attention.wqkv, PairedLinear)
    return sum(isinstance(m, PairedLinear) for m in model.modules())


def products(layers: nn.Module) -> str:
    """What multiplies ``layers``' weights: ``row_linear`` (the pairs layout), ``onednn``
    (packed) or ``aten`` (plain or int8 layers)."""
    modules = list(layers.modules())
    if any(isinstance(m, PairedLinear) for m in modules):
        return "row_linear"
    return "onednn" if any(isinstance(m, PackedLinear) for m in modules) else "aten"
