"""Linear layers with weights pre-packed into oneDNN's blocked layout (CPU: bf16, and fp32).

``F.linear`` on a bf16 CPU tensor already runs oneDNN, but reorders the plain ``[out, in]``
weight into oneDNN's blocked layout on every call. A decode step multiplies one activation row
by each weight once, so that per-call reorder doubles the bytes moved. Packing once at load
removes it; the kernel, and so every result bit, stays the same on a CPU with native bf16
for the rows of a decode step (checked by the tests against ``F.linear`` for 1..300 rows).
With AMX, oneDNN's kernel for many rows (a prompt's) sums a packed weight in another order:
37 of 384000 outputs of 300 rows came out a bf16 step apart (a Xeon with AMX). Where oneDNN
emulates bf16 (AVX-512 without BF16, where ``dtype auto`` is fp32), its few-row kernel does:
one output in 1000-4000 comes out a bf16 step apart (an AVX-512 Xeon).
Measured on the 2-core dev CPU, one bf16 row through distinct weights beyond the caches:
8192x1024 in 0.26 ms instead of 0.59 ms, the 102048x1024 output head in 2.7 ms instead of
7.2 ms (65-77 GB/s against ~28 GB/s).

Fuse each SwiGLU's gate and up projections first (:func:`fuse_gate_up_`): one wide product
reads at a higher rate than two half-width ones, with identical rows.

fp32 packs too (:func:`packs_fp32`), for a CPU without native bf16 where ``dtype auto`` means
fp32: ``F.linear`` runs MKL's fp32 kernel there, which reads a weight beyond the caches at
16-18 GB/s where oneDNN's packed kernel reads 22-25 GB/s (2-core dev CPU, 27 GB/s measured by
summing). The kernel differs, so the results differ by fp32 roundings (about 1e-4 absolute on
unit-scale rows): explicit ``fp32``, the bit-exact parity mode, keeps ``F.linear``.

On a CPU with AVX512-BF16 the fused ops' library holds bf16 weights in a layout of its own
instead, with its own kernel (``PairedLinear``, :mod:`streamtts.models.fish.fused.pairs`).

Under ``torch.compile`` a packed layer is one opaque op (:func:`packed_linear`): inductor lowers
oneDNN's linear only for weights it packed itself (frozen constants), so the compiled codebook
pass calls the same kernel on the same packed weight as eager and fuses only the ops around it.
"""

from __future__ import annotations

import torch
from torch import nn

from streamtts.models.fish.swap import replace_linears_


@torch.library.custom_op("streamtts::packed_linear", mutates_args=())
def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """oneDNN's linear on a weight packed by ``_reorder_linear_weight``: [..., in] → [..., out]."""
    y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return y


@packed_linear.register_fake
def _packed_linear_shape(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


class PackedLinear(nn.Module):
    """``y = x @ weightᵀ + bias`` with the weight held in oneDNN's blocked layout."""

    packed: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        packed: torch.Tensor | None = None,
    ) -> None:
        """``packed``: ``weight`` already in this class's layout (None: packed here)."""
        super().__init__()
        self.out_features, self.in_features = (int(n) for n in weight.shape)
        self.weight_bytes = weight.numel() * weight.element_size()
        self.packed = self._pack(weight.detach()) if packed is None else packed
        self.register_buffer("bias", None if bias is None else bias.detach())

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        # The batch-size hint only picks the blocking; any row count is accepted afterwards.
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        return packed

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # eager skips the custom op's dispatch (~10 µs a call)
            out: torch.Tensor = packed_linear(x, self.packed, self.bias, self.out_features)
            return out
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.packed, self.bias, "none", [], ""
        )
        return y


def _onednn_cpu(device: torch.device) -> bool:
    return device.type == "cpu" and bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]


def packs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether weights of ``dtype`` on ``device`` pack: bf16 on a CPU with oneDNN bf16 kernels."""
    return (
        _onednn_cpu(device)
        and dtype == torch.bfloat16
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def packs_fp32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether fp32 weights on ``device`` pack: a CPU with oneDNN."""
    return _onednn_cpu(device) and dtype == torch.float32


def can_pack(model: nn.Module, fp32: bool = False) -> bool:
    """Packing applies to a bf16 model on a CPU whose oneDNN has bf16 kernels, and with
    ``fp32`` also to an fp32 model on a CPU with oneDNN (:func:`packs_fp32`)."""
    weight = next(model.parameters())
    return packs(weight.device, weight.dtype) or (fp32 and packs_fp32(weight.device, weight.dtype))


def pack_linears_(model: nn.Module) -> int:
    """Pack every ``nn.Linear`` of ``model`` in place. Returns how many layers were packed."""
    return replace_linears_(model, PackedLinear.from_linear)


def is_packed(model: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())
