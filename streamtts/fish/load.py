"""Load what the Fish engine runs: the text-to-semantic LLM and the Firefly decoder.

Sources (see :mod:`streamtts.fish.spec`): a Fish-Speech 1.5 checkpoint directory (nothing is
downloaded), or ``synthetic:<size>`` (the same architectures with seeded random weights).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from streamtts.fish.settings import INT8, FishSettings
from streamtts.fish.spec import FishSpec
from streamtts.models.fish.codec.config import VocoderConfig
from streamtts.models.fish.codec.decoder import FireflyDecoder
from streamtts.models.fish.codec.encoder import FireflyEncoder
from streamtts.models.fish.codec.firefly import GENERATOR_FILENAME, load_firefly
from streamtts.models.fish.fused.pairs import pair_linears_, slow_layers_pair, why_not_paired
from streamtts.models.fish.llm.checkpoint import FishLLM, load_fish_llm
from streamtts.models.fish.llm.llama import DualARTransformer, fuse_gate_up_
from streamtts.models.fish.llm.quantize import quantize_int8_
from streamtts.models.fish.llm.synthetic import load_synthetic
from streamtts.models.fish.packed import can_pack, pack_linears_, packs

log = logging.getLogger(__name__)

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
    spec: FishSpec
    llm: FishLLM
    decoder: FireflyDecoder
    encoder: FireflyEncoder  # for voice references
    codec_id: str  # what makes the reference codes (a voice of another codec is not used)


def load_fish_bundle(spec: FishSpec, device: torch.device, dtype: torch.dtype) -> FishBundle:
    if spec.synthetic_size is not None:
        size = spec.synthetic_size
        llm = load_synthetic(size, dtype, device, seed=SYNTHETIC_SEED)
        decoder, encoder = synthetic_codec(size, device)
        return FishBundle(spec, llm, decoder, encoder, f"synthetic:{size}:seed{SYNTHETIC_SEED}")
    assert spec.directory is not None
    llm = load_fish_llm(spec.directory, dtype, device)
    path = spec.directory / GENERATOR_FILENAME
    firefly = load_firefly(path, device=device, with_encoder=True)
    assert firefly.encoder is not None
    return FishBundle(spec, llm, firefly.decoder, firefly.encoder, file_fingerprint(path))


def file_fingerprint(path: Path, edge_bytes: int = 1 << 22) -> str:
    """A name for a weights file's content: its size and the digest of its first and last
    ``edge_bytes`` (hashing all 180 MB at every start would cost a second)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        digest.update(f.read(edge_bytes))
        f.seek(max(0, size - edge_bytes))
        digest.update(f.read(edge_bytes))
    return f"firefly:{digest.hexdigest()[:24]}"


def prepare_llm(model: DualARTransformer, settings: FishSettings) -> None:
    """Ready the weights for the dtype setting: int8 layers, or oneDNN-packed layers on the
    CPU — bf16 where it has the kernels, and the fp32 that ``auto`` picks where it has not
    (explicit ``fp32`` stays on upstream's kernels: the parity mode). With the fused ops on,
    bf16 layers go in the pairs layout where the CPU has AVX512-BF16 (the slow ones only
    without AMX: :mod:`streamtts.models.fish.fused.pairs`). Compiled graphs call the packed
    layers as they are (:mod:`streamtts.fish.compiled`)."""
    if settings.dtype == INT8:
        fuse_gate_up_(model)
        quantize_int8_(model)
    elif can_pack(model, fp32=not settings.parity):
        fuse_gate_up_(model)
        if settings.fused_ops and packs(model.device, model.dtype):
            if (why_not := why_not_paired()) is None:
                paired = pair_linears_(model, slow=slow_layers_pair())
                log.info("%d linear layers in the pairs layout (row_linear, AVX512-BF16)", paired)
            else:
                log.info("the linear layers stay on oneDNN: %s", why_not)
        packed = pack_linears_(model)
        log.info("packed %d linear layers into oneDNN's layout", packed)


def vocoder_row_convs(settings: FishSettings, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the bf16 vocoder's convolutions run ``row_conv`` (the fused ops on, the library
    and AVX512-BF16 there, as for the pairs layout: :func:`why_not_paired`); else oneDNN's."""
    if not settings.fused_ops or device.type != "cpu" or dtype != torch.bfloat16:
        return False
    if (why_not := why_not_paired()) is not None:
        log.info("the vocoder's convolutions stay on oneDNN: %s", why_not)
        return False
    return True


def synthetic_codec(size: str, device: torch.device) -> tuple[FireflyDecoder, FireflyEncoder]:
    """The Firefly decoder and encoder of ``synthetic:<size>`` with seeded random weights."""
    config = VocoderConfig() if size != "tiny" else VocoderConfig.from_hydra(_TINY_VOCODER)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SYNTHETIC_SEED + 100)
        decoder = FireflyDecoder(config)
        encoder = FireflyEncoder(config)
    decoder.refresh()
    return (
        decoder.to(device).eval().requires_grad_(False),
        encoder.to(device).eval().requires_grad_(False),
    )
