"""The weights of a stack of packed blocks, as the fused ops take them, and when they apply."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from streamtts.models.fish.llm.llama import TransformerBlock
from streamtts.models.fish.packed import PackedLinear


def packed(module: object) -> PackedLinear:
    assert isinstance(module, PackedLinear)
    return module


@dataclass(frozen=True)
class LayerWeights:
    """Per block, in the order ``csrc/packed_ops.h`` reads them."""

    norms: list[torch.Tensor]  # [2L]: attention_norm, ffn_norm
    packed: list[torch.Tensor]  # [4L]: wqkv, wo, w13, w2 (oneDNN's layout, or pairs.py's)
    qkv_bias: list[torch.Tensor | None]  # [L]
    heads: tuple[int, int, int]  # H query heads, G KV heads, Dh head dim

    @classmethod
    def of(cls, blocks: nn.ModuleList) -> LayerWeights:
        first = blocks[0]
        assert isinstance(first, TransformerBlock)
        shape = (first.attention.n_head, first.attention.n_kv_head, first.attention.head_dim)
        weights = cls([], [], [], shape)
        for block in blocks:
            assert isinstance(block, TransformerBlock)
            attention, feed_forward = block.attention, block.feed_forward
            wqkv = packed(attention.wqkv)
            weights.norms.extend((block.attention_norm.weight, block.ffn_norm.weight))
            products = (attention.wo, feed_forward.w13, feed_forward.w2)
            weights.packed.extend((wqkv.packed, *(packed(m).packed for m in products)))
            weights.qkv_bias.append(wqkv.bias)
        return weights


def why_not_packed(name: str, blocks: nn.ModuleList, outputs: list[object]) -> str | None:
    """Why a fused op cannot run ``blocks`` (the ``name`` layers) and their ``outputs`` (None:
    it can): each block's gate and up projections fused, and every product packed for oneDNN."""
    products: list[object] = list(outputs)
    for block in blocks:
        assert isinstance(block, TransformerBlock)
        attention, feed_forward = block.attention, block.feed_forward
        if feed_forward.w13 is None:
            return "the gate and up projections are not fused"
        products += [attention.wqkv, attention.wo, feed_forward.w13, feed_forward.w2]
    if not all(isinstance(m, PackedLinear) for m in products):
        return f"the {name} layers are not packed for oneDNN"
    return None
