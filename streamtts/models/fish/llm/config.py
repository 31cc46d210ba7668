"""Fish-Speech 1.5 text-to-semantic model configuration (``config.json``).

Parsing follows the upstream rules (spec §1.2): ``head_dim`` is always recomputed as
``dim // n_head``; ``n_local_heads == -1`` means ``n_head``; a null ``intermediate_size`` becomes
``find_multiple(int(2 * 4 * dim / 3), 256)``; every ``fast_*`` field that is null or absent
falls back to its slow counterpart; absent fields take the upstream code defaults.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Upstream code defaults, used only when config.json lacks a field.
_DEFAULTS: dict[str, Any] = {
    "model_type": "dual_ar",
    "vocab_size": 32000,
    "n_layer": 32,
    "n_head": 32,
    "n_local_heads": -1,
    "dim": 4096,
    "intermediate_size": None,
    "rope_base": 10000.0,
    "norm_eps": 1e-5,
    "max_seq_len": 2048,
    "dropout": 0.0,
    "tie_word_embeddings": True,
    "attention_qkv_bias": False,
    "codebook_size": 160,
    "num_codebooks": 4,
    "n_fast_layer": 4,
    "share_codebook_embeddings": True,
}


def find_multiple(n: int, k: int) -> int:
    """Smallest multiple of ``k`` that is >= ``n``."""
    return n if n % k == 0 else n + k - (n % k)


@dataclass(frozen=True)
class BlockConfig:
    """Shape of one transformer stack (the slow LLaMA or the fast codebook transformer)."""

    n_layer: int
    dim: int
    n_head: int
    n_local_heads: int
    head_dim: int
    intermediate_size: int
    attention_qkv_bias: bool
    norm_eps: float
    rope_base: float


@dataclass(frozen=True)
class FishConfig:
    """Hyper-parameters of the dual-AR text-to-semantic transformer."""

    model_type: str
    vocab_size: int
    n_layer: int
    n_head: int
    n_local_heads: int
    dim: int
    head_dim: int
    intermediate_size: int
    rope_base: float
    norm_eps: float
    max_seq_len: int
    dropout: float
    tie_word_embeddings: bool
    attention_qkv_bias: bool
    codebook_size: int
    num_codebooks: int
    n_fast_layer: int
    fast_dim: int
    fast_n_head: int
    fast_n_local_heads: int
    fast_head_dim: int
    fast_intermediate_size: int
    fast_attention_qkv_bias: bool
    share_codebook_embeddings: bool

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FishConfig:
        """Apply the upstream parsing rules to a decoded ``config.json`` object."""

        def get(name: str) -> Any:
            value = raw.get(name)
            return _DEFAULTS.get(name) if value is None else value

        dim = int(get("dim"))
        n_head = int(get("n_head"))
        n_local_heads = int(get("n_local_heads"))
        if n_local_heads == -1:
            n_local_heads = n_head
        intermediate = get("intermediate_size")
        if intermediate is None:
            intermediate = find_multiple(int(2 * 4 * dim / 3), 256)
        qkv_bias = bool(get("attention_qkv_bias"))

        def fast(name: str, slow_value: Any) -> Any:
            value = raw.get(name)
            return slow_value if value is None else value

        fast_dim = int(fast("fast_dim", dim))
        fast_n_head = int(fast("fast_n_head", n_head))
        fast_n_local_heads = int(fast("fast_n_local_heads", n_local_heads))
        if fast_n_local_heads == -1:
            fast_n_local_heads = fast_n_head
        config = cls(
            model_type=str(get("model_type")),
            vocab_size=int(get("vocab_size")),
            n_layer=int(get("n_layer")),
            n_head=n_head,
            n_local_heads=n_local_heads,
            dim=dim,
            head_dim=dim // n_head,
            intermediate_size=int(intermediate),
            rope_base=float(get("rope_base")),
            norm_eps=float(get("norm_eps")),
            max_seq_len=int(get("max_seq_len")),
            dropout=float(get("dropout")),
            tie_word_embeddings=bool(get("tie_word_embeddings")),
            attention_qkv_bias=qkv_bias,
            codebook_size=int(get("codebook_size")),
            num_codebooks=int(get("num_codebooks")),
            n_fast_layer=int(get("n_fast_layer")),
            fast_dim=fast_dim,
            fast_n_head=fast_n_head,
            fast_n_local_heads=fast_n_local_heads,
            fast_head_dim=fast_dim // fast_n_head,
            fast_intermediate_size=int(fast("fast_intermediate_size", intermediate)),
            fast_attention_qkv_bias=bool(fast("fast_attention_qkv_bias", qkv_bias)),
            share_codebook_embeddings=bool(get("share_codebook_embeddings")),
        )
        config.validate()
        return config

    @classmethod
    def from_json_file(cls, path: Path) -> FishConfig:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_dict(raw)

    def validate(self) -> None:
        """Reject configurations this implementation cannot run (with a clear reason)."""
        if self.model_type != "dual_ar":
            raise ValueError(f"model_type {self.model_type!r} is not supported (only 'dual_ar')")
        if self.dim % self.n_head or self.n_head % self.n_local_heads:
            raise ValueError("dim must divide by n_head and n_head by n_local_heads")
        if self.fast_dim % self.fast_n_head or self.fast_n_head % self.fast_n_local_heads:
            raise ValueError("fast_dim must divide by fast_n_head and that by fast_n_local_heads")
        if self.fast_dim != self.dim:
            raise ValueError("fast_dim != dim (a fast_project_in layer) is not supported")
        if not self.share_codebook_embeddings:
            raise ValueError("share_codebook_embeddings=false is not supported (1.5 uses true)")

    @property
    def slow_block(self) -> BlockConfig:
        return BlockConfig(
            n_layer=self.n_layer,
            dim=self.dim,
            n_head=self.n_head,
            n_local_heads=self.n_local_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            attention_qkv_bias=self.attention_qkv_bias,
            norm_eps=self.norm_eps,
            rope_base=self.rope_base,
        )

    @property
    def fast_block(self) -> BlockConfig:
        return BlockConfig(
            n_layer=self.n_fast_layer,
            dim=self.fast_dim,
            n_head=self.fast_n_head,
            n_local_heads=self.fast_n_local_heads,
            head_dim=self.fast_head_dim,
            intermediate_size=self.fast_intermediate_size,
            attention_qkv_bias=self.fast_attention_qkv_bias,
            norm_eps=self.norm_eps,
            rope_base=self.rope_base,
        )
