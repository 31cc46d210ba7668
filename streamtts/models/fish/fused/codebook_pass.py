"""The codebook pass as one op (``csrc/codebook_pass.cpp``): a drop-in for :func:`fast_codes`.

Eager, the pass of a frame (4 layers at 8 positions, then sampling 7 codebooks) is ~1100 small
kernels around 135 matrix products, and Python runs between every two of them: on the 2-core
dev CPU (bf16, AMX, 2026-12-05) the pass took 60-64 ms where its 135 products alone took 37-41.
The op makes the same ATen calls in the same order from C++, so its codes, KV-cache writes and
every result bit are the Python pass's (tested), in 44-49 ms. It applies where the fast layers
are packed for oneDNN (:mod:`streamtts.models.fish.packed`: bf16 on a CPU with native bf16, the
fp32 of ``dtype auto`` on one without) or paired (:mod:`~.pairs`: bf16 with AVX512-BF16), and
the codebook is sampled by sorting (K < 8192).
"""

from __future__ import annotations

import torch

from streamtts.models.fish.fused.layers import LayerWeights, packed, why_not_packed
from streamtts.models.fish.fused.library import FusedUnavailable
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache
from streamtts.models.fish.llm.sampling import COUNTING_MIN_VOCAB, BatchSampling


def why_not_fused_codebook_pass(model: DualARTransformer) -> str | None:
    """Why the fused codebook pass does not apply to ``model`` (None: it does)."""
    if model.device.type != "cpu":
        return f"the model is on {model.device.type}, not the CPU"
    if model.config.codebook_size >= COUNTING_MIN_VOCAB:
        return f"codebooks of {model.config.codebook_size} entries are not sampled by sorting"
    return why_not_packed("fast", model.fast_layers, [model.fast_output])


class FusedCodebookPass:
    """:func:`fast_codes` for one model whose fast layers are packed: the
    ``streamtts_fused::codebook_pass`` op (:func:`~.library.load_library` first)."""

    def __init__(self, model: DualARTransformer) -> None:
        if (reason := why_not_fused_codebook_pass(model)) is not None:
            raise FusedUnavailable(reason)
        self.model = model
        self._layers = LayerWeights.of(model.fast_layers)
        self._output = packed(model.fast_output).packed

    def __call__(
        self,
        model: DualARTransformer,
        cache: KVCache,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        sampling: BatchSampling,
        windows: torch.Tensor | None,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        """:func:`fast_codes`: hidden [B, D], code0 [B] → codebooks 1.. [B, C-1] int64."""
        if model is not self.model:
            raise ValueError("this fused pass holds another model's weights")
        n_q, n_kv, dh = self._layers.heads
        codes: torch.Tensor = torch.ops.streamtts_fused.codebook_pass(
            hidden,
            code0.long(),
            self._layers.norms,
            self._layers.packed,
            self._layers.qkv_bias,
            model.fast_norm.weight,
            self._output,
            model.fast_embeddings.weight,
            model.fast_rope,
            cache.fast_k,
            cache.fast_v,
            sampling.temperature,
            sampling.top_p,
            sampling.repetition_penalty,
            windows,
            noise,
            n_q,
            n_kv,
            dh,
            model.fast_norm.eps,
        )
        return codes
