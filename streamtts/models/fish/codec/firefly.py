"""The Firefly codec: loading a generator checkpoint into a decoder and (optionally) an encoder.

The engine only needs the decoder (about 25M of the 47M parameters); voice registration needs
the encoder. Both are built on the meta device and then take the checkpoint tensors directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from streamtts.models.fish.codec.checkpoint import read_generator_state_dict
from streamtts.models.fish.codec.config import VocoderConfig, load_vocoder_config
from streamtts.models.fish.codec.decoder import FireflyDecoder, decoder_key
from streamtts.models.fish.codec.encoder import FireflyEncoder, encoder_key

GENERATOR_FILENAME = "firefly-gan-vq-fsq-8x1024-21hz-generator.pth"


@dataclass
class Firefly:
    config: VocoderConfig
    decoder: FireflyDecoder
    encoder: FireflyEncoder | None


def _select(
    weights: Mapping[str, Tensor], rename: Callable[[str], str | None]
) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for key, value in weights.items():
        new = rename(key)
        if new is not None:
            out[new] = value
    return out


def _materialise(
    module: nn.Module, weights: Mapping[str, Tensor], device: torch.device, what: str
) -> None:
    """Load ``weights`` into a meta-device ``module`` (strict: missing/extra keys raise)."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{what}: checkpoint does not match the architecture; "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    for key, value in weights.items():
        if key in expected and expected[key].shape != value.shape:
            raise ValueError(
                f"{what}: {key} has shape {tuple(value.shape)}, config expects "
                f"{tuple(expected[key].shape)} (wrong vocoder_config.json?)"
            )
    module.load_state_dict(
        {k: v.to(device=device, dtype=torch.float32) for k, v in weights.items()},
        strict=True,
        assign=True,
    )


def load_firefly(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    config: VocoderConfig | None = None,
    with_encoder: bool = True,
) -> Firefly:
    """Load a generator ``.pth`` (or a directory holding one) in fp32, eval mode, no grads.

    Weights of any stored dtype are loaded as fp32 (the released file is fp32); use
    :class:`~streamtts.models.fish.codec.incremental.IncrementalDecoder` for bf16 decoding.

    ``config``: defaults to ``vocoder_config.json`` beside the weights, else the released one.
    """
    path = Path(path)
    if path.is_dir():
        path = path / GENERATOR_FILENAME
    cfg = config or load_vocoder_config(path)
    dev = torch.device(device)
    weights = read_generator_state_dict(path)
    with torch.device("meta"):
        decoder = FireflyDecoder(cfg)
        encoder = FireflyEncoder(cfg) if with_encoder else None
    _materialise(decoder, _select(weights, decoder_key), dev, "decoder")
    decoder.refresh()
    decoder.eval().requires_grad_(False)
    if encoder is not None:
        _materialise(encoder, _select(weights, encoder_key), dev, "encoder")
        encoder.eval().requires_grad_(False)
    return Firefly(cfg, decoder, encoder)
