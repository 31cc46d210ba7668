"""The slow transformer's decode step as one op (``csrc/slow_step.cpp``): a drop-in for
:meth:`DualARTransformer.decode_slow`.

Eager, a step is ~30 kernels in each of the 24 layers around 4 matrix products, and Python runs
between every two of them; the op makes the same ATen calls in the same order from C++, so its
logits, hidden state and KV-cache writes are the Python step's, bit for bit (tested). On the
2-core dev CPU (bf16, AMX, 2026-12-05), batch 1 at 301 keys: 71.0 ms eager, 57.6 ms fused;
batch 3: 73.1 and 61.0 ms. It applies where the slow layers and the head are packed for oneDNN.
"""

from __future__ import annotations

import torch

from streamtts.models.fish.fused.layers import LayerWeights, packed, why_not_packed
from streamtts.models.fish.fused.library import FusedUnavailable
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache, SlowOutput, padded_kv_len


def why_not_fused_slow_step(model: DualARTransformer) -> str | None:
    """Why the fused slow step does not apply to ``model`` (None: it does)."""
    if model.device.type != "cpu":
        return f"the model is on {model.device.type}, not the CPU"
    outputs: list[object] = [] if model.output is None else [model.output]  # None: tied
    return why_not_packed("slow", model.layers, outputs)


class FusedSlowStep:
    """:meth:`DualARTransformer.decode_slow` for one model whose slow layers are packed: the
    ``streamtts_fused::slow_step`` op (:func:`~.library.load_library` first)."""

    def __init__(self, model: DualARTransformer) -> None:
        if (reason := why_not_fused_slow_step(model)) is not None:
            raise FusedUnavailable(reason)
        self.model = model
        self._layers = LayerWeights.of(model.layers)
        self._output = None if model.output is None else packed(model.output).packed

    def __call__(
        self,
        model: DualARTransformer,
        cache: KVCache,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        kv_len: int,
    ) -> SlowOutput:
        """:meth:`DualARTransformer.decode_slow`: tokens [B, C+1, 1], slots and positions [B]
        → logits [B, V], hidden [B, D]."""
        self._check(model)
        logits, hidden = torch.ops.streamtts_fused.slow_step(
            tokens,
            slots,
            positions,
            padded_kv_len(kv_len, cache.max_seq_len),
            *self._weights(cache),
            model.decodes_attention_in_fp32(tokens.device),
        )
        return SlowOutput(logits, hidden)

    def prefill(
        self,
        model: DualARTransformer,
        cache: KVCache,
        tokens: torch.Tensor,
        slot: int,
        start_pos: int = 0,
        return_all: bool = False,
    ) -> SlowOutput:
        """:meth:`DualARTransformer.prefill`: tokens [C+1, S] into ``slot`` from
        ``start_pos`` → logits and hidden state of the last position ([V], [D]), or of all
        ([S, V], [S, D]) with ``return_all``."""
        self._check(model)
        tokens = tokens.to(model.device)
        _, kv_len = cache.prefill_span(start_pos, tokens.shape[-1])
        logits, hidden = torch.ops.streamtts_fused.slow_prefill(
            tokens,
            slot,
            start_pos,
            kv_len,
            *self._weights(cache),
            return_all,
        )
        return SlowOutput(logits, hidden)

    def _check(self, model: DualARTransformer) -> None:
        if model is not self.model:
            raise ValueError("this fused step holds another model's weights")

    def _weights(self, cache: KVCache) -> tuple[object, ...]:
        """The ops' arguments from the norms to the epsilon: the model's weights and shapes,
        and ``cache``'s tensors."""
        model = self.model
        n_q, n_kv, dh = self._layers.heads
        return (
            self._layers.norms,
            self._layers.packed,
            self._layers.qkv_bias,
            model.norm.weight,
            self._output,
            model.embeddings.weight,
            model.codebook_embeddings.weight,
            model.slow_rope,
            cache.k,
            cache.v,
            model.config.codebook_size,
            model.semantic_begin_id,
            model.semantic_end_id,
            n_q,
            n_kv,
            dh,
            model.norm.eps,
        )
