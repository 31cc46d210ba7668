"""``synthetic:<size>``: the Fish-Speech 1.5 architecture with seeded random weights.

Synthetic models exercise the real code path at the real cost without downloaded weights. They
produce noise, never speech. Random weights would stop at random, so the engine ends a
synthetic segment after :func:`synthetic_frame_budget` frames: about as many as real speech of
that text takes (≈ 9 frames per English word at 21.5 frames/s and ~2.4 words/s).

Sizes: ``tiny`` (the parity-fixture shape, for tests) and ``1.5`` (the released configuration,
637,921,280 parameters). Weights are drawn directly in the target dtype (no fp32 copy). The
synthetic tokenizer is a small byte-level BPE trained here on a built-in text, padded with
unreachable filler entries so the special ids sit where the real tokenizer's do (N = 100000
for ``1.5``).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from streamtts.models.fish.llm.checkpoint import (
    CONFIG_FILE,
    MODEL_FILE,
    TOKENIZER_FILE,
    FishLLM,
    build_model,
)
from streamtts.models.fish.llm.config import FishConfig
from streamtts.models.fish.llm.llama import DualARTransformer
from streamtts.models.fish.llm.tokenizer import FishTokenizer

_COMMON: dict[str, Any] = {
    "model_type": "dual_ar",
    "rope_base": 1000000.0,
    "norm_eps": 1e-6,
    "dropout": 0.0,
    "tie_word_embeddings": False,
    "attention_qkv_bias": False,
    "codebook_size": 1024,
    "num_codebooks": 8,
    "fast_attention_qkv_bias": False,
}

# config.json contents per size; "num_mergeable" is the tokenizer's N (not a config field).
SYNTHETIC_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        **_COMMON,
        "vocab_size": 1664,
        "n_layer": 2,
        "n_head": 4,
        "n_local_heads": 2,
        "dim": 64,
        "intermediate_size": 160,
        "max_seq_len": 1024,
        "n_fast_layer": 1,
        "fast_dim": 64,
        "fast_n_head": 4,
        "fast_n_local_heads": 2,
        "fast_intermediate_size": 160,
    },
    "1.5": {
        **_COMMON,
        "vocab_size": 102048,
        "n_layer": 24,
        "n_head": 16,
        "n_local_heads": 2,
        "dim": 1024,
        "intermediate_size": 4096,
        "max_seq_len": 8192,
        "n_fast_layer": 4,
        "fast_dim": 1024,
        "fast_n_head": 16,
        "fast_n_local_heads": 2,
        "fast_intermediate_size": 4096,
    },
}
NUM_MERGEABLE = {"tiny": 600, "1.5": 100000}
INIT_STD = 0.02

FRAMES_PER_WORD = 9  # English: 21.53 frames/s ÷ ~2.4 words/s
FRAMES_PER_CJK_CHAR = 5  # Chinese/Japanese/Korean: ~4.3 syllables/s
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_WORD = re.compile(r"[^\W_]+")

_BPE_TRAINING_TEXT = """
Hello world. This is a synthetic voice for testing the streaming text to speech server.
The quick brown fox jumps over the lazy dog while the weather is nice and the sun is shining.
We would like to hear how the system sounds when it reads numbers like 1234 and 3.14, and
punctuation: commas, periods! questions? It should never claim to be speech; it is noise.
你好，世界！今天天气很好，我们一起去公园散步吧。这是一个用于测试的合成声音。
"""


def synthetic_frame_budget(text: str) -> int:
    """Frames real speech of ``text`` would take: 9 per word, 5 per CJK character (≥ 1)."""
    cjk_chars = len(_CJK.findall(text))
    words = len(_WORD.findall(_CJK.sub(" ", text)))
    return max(1, FRAMES_PER_WORD * words + FRAMES_PER_CJK_CHAR * cjk_chars)


def synthetic_config(size: str) -> FishConfig:
    return FishConfig.from_dict(_size_entry(size))


def _size_entry(size: str) -> dict[str, Any]:
    if size not in SYNTHETIC_SIZES:
        raise ValueError(f"unknown synthetic size {size!r}; choose from {sorted(SYNTHETIC_SIZES)}")
    return SYNTHETIC_SIZES[size]


def _train_merges(text: str, max_merges: int) -> list[bytes]:
    """Greedy byte-pair merges over the words of ``text`` (most frequent pair first)."""
    words = Counter(tuple(bytes([b]) for b in w.encode()) for w in re.findall(r" ?\S+", text))
    merges: list[bytes] = []
    while len(merges) < max_merges:
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = best[0] + best[1]
        merges.append(merged)
        words = Counter({_merge_word(w, best, merged): c for w, c in words.items()})
    return merges


def _merge_word(
    word: tuple[bytes, ...], pair: tuple[bytes, bytes], merged: bytes
) -> tuple[bytes, ...]:
    out: list[bytes] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def synthetic_mergeable_ranks(num_mergeable: int) -> dict[bytes, int]:
    """256 bytes, trained merges, then filler no input can reach: ``num_mergeable`` entries."""
    ranks = {bytes([b]): b for b in range(256)}
    for token in _train_merges(_BPE_TRAINING_TEXT, max(0, min(num_mergeable - 256, 400))):
        ranks.setdefault(token, len(ranks))
    filler = 0
    while len(ranks) < num_mergeable:
        # Starts with two NUL bytes: no two-byte merge produces it, so BPE never emits it.
        ranks[b"\x00\x00" + filler.to_bytes(4, "big")] = len(ranks)
        filler += 1
    return ranks


def synthetic_tokenizer(size: str) -> FishTokenizer:
    _size_entry(size)
    return FishTokenizer(synthetic_mergeable_ranks(NUM_MERGEABLE[size]), name=f"synthetic-{size}")


def synthetic_state_dict(
    config: FishConfig, dtype: torch.dtype, seed: int = 0, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Seeded weights drawn directly in ``dtype``: N(0, 0.02) matrices, RMSNorm weights 1."""
    with torch.device("meta"):
        shapes = DualARTransformer(config, 0, 0).state_dict()
    generator = torch.Generator(device=device).manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, meta in shapes.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(meta.shape, dtype=dtype, device=device)
        else:
            tensor = torch.empty(meta.shape, dtype=dtype, device=device)
            state[name] = tensor.normal_(0.0, INIT_STD, generator=generator)
    return state


def load_synthetic(
    size: str,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> FishLLM:
    """Build ``synthetic:<size>`` in memory."""
    config = synthetic_config(size)
    tokenizer = synthetic_tokenizer(size)
    state = synthetic_state_dict(config, dtype, seed, device)
    return FishLLM(build_model(state, config, tokenizer, dtype, device), tokenizer)


def write_synthetic_checkpoint(
    directory: Path, size: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> Path:
    """Write ``model.pth``, ``config.json`` and ``tokenizer.tiktoken`` in the upstream format."""
    directory.mkdir(parents=True, exist_ok=True)
    entry = _size_entry(size)
    state = synthetic_state_dict(FishConfig.from_dict(entry), dtype, seed)
    torch.save(state, directory / MODEL_FILE)
    del state
    (directory / CONFIG_FILE).write_text(json.dumps(entry, indent=2), encoding="utf-8")
    ranks = synthetic_mergeable_ranks(NUM_MERGEABLE[size])
    _write_tiktoken(directory / TOKENIZER_FILE, ranks.items())
    return directory


def _write_tiktoken(path: Path, ranks: Iterable[tuple[bytes, int]]) -> None:
    lines = (f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ranks)
    path.write_text("".join(lines), encoding="ascii")


def parameter_count(config: FishConfig) -> int:
    with torch.device("meta"):
        model = DualARTransformer(config, 0, 0)
    return sum(math.prod(p.shape) for p in model.parameters())
