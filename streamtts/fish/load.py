"""Load what the Fish engine runs: the text-to-semantic LLM and the Firefly decoder.

Sources: a Fish-Speech 1.5 checkpoint directory (nothing is downloaded), or ``synthetic:<size>``
(the same architectures with seeded random weights: for tests and benchmarks; it produces noise,
never speech).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from streamtts.models.fish.codec.config import VocoderConfig
from streamtts.models.fish.codec.decoder import FireflyDecoder
from streamtts.models.fish.codec.firefly import GENERATOR_FILENAME, load_firefly
from streamtts.models.fish.llm.checkpoint import FishLLM, load_fish_llm
from streamtts.models.fish.llm.synthetic import load_synthetic

SYNTHETIC_PREFIX = "synthetic:"
SYNTHETIC_SEED = 0

# A small vocoder for ``synthetic:tiny`` (upstream config field names), so plumbing tests run
# the real decode path at a fraction of the cost.
_TINY_VOCODER = {
    "backbone": {"depths": [1, 1, 1, 1], "dims": [32, 48, 64, 64]},
    "head": {"num_mels": 64, "upsample_initial_channel": 64},
    "quantizer": {"input_dim": 64},
}


@dataclass(frozen=True)
class FishBundle:
    name: str
    llm: FishLLM
    decoder: FireflyDecoder
    synthetic: bool


def is_fish_spec(spec: str) -> bool:
    return spec.startswith(SYNTHETIC_PREFIX) or Path(spec).expanduser().is_dir()


def load_fish_bundle(spec: str, device: torch.device, dtype: torch.dtype) -> FishBundle:
    """``spec``: a checkpoint directory or ``synthetic:tiny`` / ``synthetic:1.5``."""
    if spec.startswith(SYNTHETIC_PREFIX):
        size = spec.removeprefix(SYNTHETIC_PREFIX)
        llm = load_synthetic(size, dtype, device, seed=SYNTHETIC_SEED)
        return FishBundle(spec, llm, synthetic_decoder(size, device), synthetic=True)
    directory = Path(spec).expanduser()
    llm = load_fish_llm(directory, dtype, device)
    firefly = load_firefly(directory / GENERATOR_FILENAME, device=device, with_encoder=False)
    return FishBundle(directory.name, llm, firefly.decoder, synthetic=False)


def synthetic_decoder(size: str, device: torch.device) -> FireflyDecoder:
    config = VocoderConfig() if size != "tiny" else VocoderConfig.from_hydra(_TINY_VOCODER)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SYNTHETIC_SEED + 100)
        decoder = FireflyDecoder(config)
    decoder.refresh()
    return decoder.to(device).eval().requires_grad_(False)
