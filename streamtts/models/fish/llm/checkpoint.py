"""Load a Fish-Speech 1.5 text-to-semantic checkpoint directory (spec §1).

The directory holds ``model.pth`` (a ``torch.save`` state dict), ``config.json`` and
``tokenizer.tiktoken``; ``special_tokens.json`` is ignored, as upstream ignores it. Loader
tolerances follow upstream: a nested ``state_dict`` is descended into, a ``model.`` prefix is
removed, separate ``wq``/``wk``/``wv`` weights are fused into ``wqkv``. The file is memory-mapped
and its tensors are adopted by a model built on the meta device, so loading does not hold two
copies of the weights (bf16 on disk → bf16 model shares the mapped pages).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from streamtts.models.fish.llm.config import FishConfig
from streamtts.models.fish.llm.llama import DualARTransformer
from streamtts.models.fish.llm.tokenizer import FishTokenizer

log = logging.getLogger(__name__)

MODEL_FILE = "model.pth"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.tiktoken"
REQUIRED_FILES = (MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE)
_PREFIX = "model."


class CheckpointError(ValueError):
    """The checkpoint directory is missing, incomplete or does not fit the architecture."""


@dataclass(frozen=True)
class FishLLM:
    """A loaded text-to-semantic model with its tokenizer."""

    model: DualARTransformer
    tokenizer: FishTokenizer

    @property
    def config(self) -> FishConfig:
        return self.model.config


def normalize_state_dict(raw: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """Apply the upstream key tolerances: nested ``state_dict``, ``model.`` prefix, split QKV."""
    nested = raw.get("state_dict")
    if isinstance(nested, Mapping):
        raw = nested
    items = [(k, v) for k, v in raw.items() if isinstance(v, torch.Tensor)]
    if items and items[0][0].startswith(_PREFIX):
        items = [(k.replace(_PREFIX, ""), v) for k, v in items]
    state = dict(items)
    for q_key in [k for k in state if k.endswith(".wq.weight")]:
        base = q_key[: -len("wq.weight")]
        parts = [state.pop(f"{base}{name}.weight") for name in ("wq", "wk", "wv")]
        state[f"{base}wqkv.weight"] = torch.cat(parts, dim=0)
    return state


def _check_directory(directory: Path) -> None:
    if not directory.is_dir():
        raise CheckpointError(f"Fish checkpoint directory not found: {directory}")
    missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{directory} is not a Fish-Speech 1.5 checkpoint: missing {', '.join(missing)}"
        )


def build_model(
    state: Mapping[str, torch.Tensor],
    config: FishConfig,
    tokenizer: FishTokenizer,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> DualARTransformer:
    """Adopt ``state`` into a model built on the meta device, then cast/move to dtype/device."""
    if tokenizer.vocab_size_min > config.vocab_size:
        raise CheckpointError(
            f"tokenizer needs {tokenizer.vocab_size_min} ids but vocab_size is {config.vocab_size}"
        )
    with torch.device("meta"):
        model = DualARTransformer(config, tokenizer.semantic_begin_id, tokenizer.semantic_end_id)
    expected = set(model.state_dict())
    missing = sorted(expected - set(state))
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
    unexpected = sorted(set(state) - expected)
    if unexpected:
        log.warning(
            "ignoring %d unexpected checkpoint tensors, e.g. %s", len(unexpected), unexpected[:5]
        )
    try:
        model.load_state_dict({k: state[k] for k in expected}, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint does not fit config.json: {exc}") from exc
    model = model.to(device=device, dtype=dtype)
    model.reset_rope_tables(torch.device(device))
    return model.eval().requires_grad_(False)


def load_fish_llm(
    directory: Path | str, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu"
) -> FishLLM:
    """Load ``model.pth`` + ``config.json`` + ``tokenizer.tiktoken`` from ``directory``."""
    directory = Path(directory)
    _check_directory(directory)
    try:
        config = FishConfig.from_json_file(directory / CONFIG_FILE)
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{directory / CONFIG_FILE}: {exc}") from exc
    tokenizer = FishTokenizer.from_file(directory / TOKENIZER_FILE)
    try:
        raw = torch.load(directory / MODEL_FILE, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(f"cannot read {directory / MODEL_FILE}: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"{directory / MODEL_FILE} does not hold a state dict")
    state = normalize_state_dict(raw)
    return FishLLM(build_model(state, config, tokenizer, dtype, device), tokenizer)
