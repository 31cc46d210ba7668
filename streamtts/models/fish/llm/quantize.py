"""Int8 weight-only quantization of the text-to-semantic model's linear layers (CPU).

Each weight matrix ``[out, in]`` is stored as int8 with one symmetric scale per output channel
(``scale = max|w_row| / 127``). A decode step is memory-bound, so reading a quarter of fp32's
bytes (half of bf16's) makes it faster: on the 2-core dev CPU a 4096x1024 matrix-vector
product takes 0.12 ms instead of 0.32 ms in bf16 (24 distinct matrices, beyond the caches).
The matrix-vector products of decode steps are torch's ``_weight_int8pack_mm`` CPU kernel.

That kernel is vectorized for bf16 activations but not for fp32 ones (on a Zen 3 without
native bf16: 1.1 ms per 4096x1024 product with bf16 activations, 6.1 ms with fp32, 2.3 ms for
a packed fp32 weight), so it always runs in bf16 (:data:`ROW_KERNEL_DTYPE`): a model computing
in fp32 (``int8`` where the CPU has no native bf16, see ``streamtts.fish.devices``) rounds a
decode step's inputs to bf16 for it and takes its bf16 outputs back to fp32; everything around
the products stays fp32.

The row kernel works row by row, so its cost grows linearly with the rows: a 64-token prompt
chunk took 1.6 ms per 4096x1024 matrix, twice bf16's 0.78 ms. Prompt chunks (a sequence axis of
at least :data:`PROMPT_GEMM_MIN_TOKENS` for the dtype) therefore convert the integers to the
model's dtype (exact: |q| <= 127) and run a matrix-matrix kernel, scaling each output channel
after it: 0.84 ms in bf16. The conversion goes into one reused buffer per thread
(:class:`_ConversionBuffers`, as large as the largest layer: 32 MB for the fused 8192x1024
gate/up in fp32): a fresh tensor per layer is fresh pages from the OS every time, and on a
Zen 3 (2026-12-03, fp32, 64-token prefill of ``synthetic:1.5``) those page faults made the
prefill 833 ms where the reused buffer gives 523 ms. fp32 products then run oneDNN's kernel on
the plain weight, as the packed fp32 layers of ``dtype auto`` do, instead of MKL's (424 ms
against 523, and against 406 ms for ``auto``'s packed fp32 weights); bf16's ``F.linear`` is
oneDNN already. In bf16 the output is rounded twice (the product, then the scaled product)
where the row kernel rounds once: a prompt's activations may differ from the row kernel's by a
bf16 step. Decode steps (one position per row, any batch) always take the row kernel, so a
stream's frames do not depend on how many other streams share its step.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

from streamtts.models.fish.packed import packs_fp32
from streamtts.models.fish.swap import replace_linears_

INT8_MAX = 127
# Prompt chunks at least this long take the convert-then-GEMM path, by the model's dtype (the
# dtypes int8 computes in). bf16: equal speed at 16 rows (Zen 5). fp32, whose row kernel runs in
# bf16: a synthetic:1.5 prefill on a Zen 3 (2026-12-03), row kernel vs GEMM, took 175 vs 246 ms
# for 16 tokens, 252-256 vs 267-294 for 24, 311 vs 277 for 32, 1148 vs 780 for 128.
PROMPT_GEMM_MIN_TOKENS = {torch.bfloat16: 16, torch.float32: 32}
ROW_KERNEL_DTYPE = torch.bfloat16  # the activations of torch's int8 row kernel, and its scales


class _ConversionBuffers(threading.local):
    """One buffer per thread and dtype for a prompt chunk's dequantized weight, grown to the
    largest layer it has held. Per thread because generators of several engines may prefill
    at once; a layer's product has finished with the buffer before the next layer fills it."""

    def __init__(self) -> None:
        self.by_dtype: dict[torch.dtype, torch.Tensor] = {}

    def converted(self, weight_q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``weight_q`` converted to ``dtype`` (exact), in this thread's buffer."""
        numel = weight_q.numel()
        buffer = self.by_dtype.get(dtype)
        if buffer is None or buffer.numel() < numel or buffer.device != weight_q.device:
            buffer = torch.empty(numel, dtype=dtype, device=weight_q.device)
            self.by_dtype[dtype] = buffer
        return buffer[:numel].view(weight_q.shape).copy_(weight_q)


_conversion_buffers = _ConversionBuffers()


class Int8Linear(nn.Module):
    """``y = x @ (q * scale)^T`` with ``q`` int8 ``[out, in]`` and ``scale`` ``[out]``."""

    weight_q: torch.Tensor
    scales: torch.Tensor

    def __init__(self, weight_q: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.in_features = int(weight_q.shape[1])
        self.out_features = int(weight_q.shape[0])
        self.register_buffer("weight_q", weight_q)
        self.register_buffer("scales", scales)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        if linear.bias is not None:
            raise ValueError("int8 weight-only layers have no bias (the Fish LLM has none)")
        weight = linear.weight.detach().float()  # [out, in]
        # Quantise against the scale as stored (rounded to the row kernel's dtype).
        scales = (weight.abs().amax(dim=1).clamp(min=1e-12) / INT8_MAX).to(ROW_KERNEL_DTYPE)
        weight_q = (weight / scales.float()[:, None]).round().clamp(-INT8_MAX, INT8_MAX)
        return cls(weight_q.to(torch.int8).contiguous(), scales)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer applies, ``[out, in]`` in float32 (for tests)."""
        return self.weight_q.float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() >= 3 and x.shape[-2] >= PROMPT_GEMM_MIN_TOKENS[x.dtype]:  # [..., S, in]
            return self._prompt_product(x)
        shape = x.shape
        flat = x.reshape(-1, self.in_features).to(ROW_KERNEL_DTYPE)  # [N, in]
        y = torch._weight_int8pack_mm(flat, self.weight_q, self.scales)  # [N, out]
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def _prompt_product(self, x: torch.Tensor) -> torch.Tensor:
        weight = _conversion_buffers.converted(self.weight_q, x.dtype)  # [out, in]
        if packs_fp32(x.device, x.dtype):
            product: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x, weight, None, "none", [], ""
            )  # [..., S, out]
        else:
            product = F.linear(x, weight)
        return product * self.scales.to(x.dtype)


def quantize_int8_(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` in place; returns how many were replaced.

    The model must be on the CPU in the dtype it will compute in (bf16 or fp32).
    """
    weight = next(model.parameters())
    if weight.device.type != "cpu":
        raise ValueError("int8 weight-only quantization is implemented for the CPU only")
    if weight.dtype not in PROMPT_GEMM_MIN_TOKENS:
        raise ValueError(f"int8 weight-only layers compute in bf16 or fp32, not {weight.dtype}")
    return replace_linears_(model, Int8Linear.from_linear)


def is_int8(model: nn.Module) -> bool:
    return any(isinstance(m, Int8Linear) for m in model.modules())
