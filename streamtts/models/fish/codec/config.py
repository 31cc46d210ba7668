"""Hyper-parameters of the Firefly codec ("firefly-gan-vq-fsq-8x1024-21hz").

Defaults are the released ``firefly_gan_vq.yaml`` values (spec §5.1). A ``vocoder_config.json``
next to the weights, written with the upstream Hydra field names, overrides them.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

CONFIG_FILENAME = "vocoder_config.json"
# Hydra keys that carry no inference-time meaning.
_IGNORED_KEYS = frozenset({"_target_", "drop_path_rate"})


@dataclass(frozen=True)
class MelConfig:
    """Log-mel front end of the encoder (spec §5.3)."""

    sample_rate: int = 44100  # Hz
    n_mels: int = 160
    n_fft: int = 2048  # samples
    hop_length: int = 512  # samples
    win_length: int = 2048  # samples


@dataclass(frozen=True)
class EncoderConfig:
    """ConvNeXt encoder backbone (spec §5.4)."""

    input_channels: int = 160
    depths: tuple[int, ...] = (3, 3, 9, 3)
    dims: tuple[int, ...] = (128, 256, 384, 512)
    kernel_size: int = 7


@dataclass(frozen=True)
class HeadConfig:
    """HiFi-GAN generator head (spec §5.6)."""

    hop_length: int = 512  # samples per mel frame
    upsample_rates: tuple[int, ...] = (8, 8, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 4, 4, 4)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    num_mels: int = 512
    upsample_initial_channel: int = 512
    pre_conv_kernel_size: int = 13
    post_conv_kernel_size: int = 13


@dataclass(frozen=True)
class QuantizerConfig:
    """Grouped FSQ with a 4x down/upsampler (spec §5.5)."""

    input_dim: int = 512
    n_groups: int = 8
    n_codebooks: int = 1
    levels: tuple[int, ...] = (8, 5, 5, 5)
    downsample_factor: tuple[int, ...] = (2, 2)


@dataclass(frozen=True)
class VocoderConfig:
    mel: MelConfig = field(default_factory=MelConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)

    def __post_init__(self) -> None:
        if self.quantizer.n_codebooks != 1:
            raise ValueError("only n_codebooks=1 (one FSQ per group) is supported")
        if math.prod(self.head.upsample_rates) != self.head.hop_length:
            raise ValueError("prod(head.upsample_rates) must equal head.hop_length")
        if self.mel.hop_length != self.head.hop_length:
            raise ValueError("mel hop_length and head hop_length differ")
        if self.quantizer.input_dim % self.quantizer.n_groups:
            raise ValueError("quantizer.input_dim must be divisible by n_groups")
        if self.head.num_mels != self.quantizer.input_dim:
            raise ValueError("head.num_mels must equal quantizer.input_dim")

    @property
    def sample_rate(self) -> int:
        """Output / input audio rate in Hz."""
        return self.mel.sample_rate

    @property
    def mel_frames_per_code(self) -> int:
        return math.prod(self.quantizer.downsample_factor)

    @property
    def samples_per_code(self) -> int:
        """Audio samples per code frame (2048 for the released model)."""
        return self.mel_frames_per_code * self.head.hop_length

    @property
    def codebook_size(self) -> int:
        """Valid indices per group are ``0 .. codebook_size - 1`` (1000 for levels 8,5,5,5)."""
        return math.prod(self.quantizer.levels)

    @classmethod
    def from_hydra(cls, raw: Mapping[str, Any]) -> VocoderConfig:
        """Build from an upstream Hydra-style dict; absent sections and fields keep defaults."""
        return cls(
            mel=_override(MelConfig(), raw.get("spec_transform", {})),
            encoder=_override(EncoderConfig(), raw.get("backbone", {})),
            head=_override(HeadConfig(), raw.get("head", {})),
            quantizer=_override(QuantizerConfig(), raw.get("quantizer", {})),
        )


_Section = TypeVar("_Section", MelConfig, EncoderConfig, HeadConfig, QuantizerConfig)


def _as_tuple(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    return value


def _override(section: _Section, raw: Mapping[str, Any]) -> _Section:
    known = {f.name for f in fields(section)}
    updates: dict[str, Any] = {}
    for key, value in raw.items():
        if key in known:
            updates[key] = _as_tuple(value)
        elif key not in _IGNORED_KEYS:
            logger.warning("vocoder config: ignoring unknown field %r", key)
    return replace(section, **updates)


def load_vocoder_config(weights_path: str | Path) -> VocoderConfig:
    """Config for a generator file: ``vocoder_config.json`` beside it, else the released one."""
    path = Path(weights_path).parent / CONFIG_FILENAME
    if not path.is_file():
        return VocoderConfig()
    with path.open(encoding="utf-8") as f:
        raw = json.load(f)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return VocoderConfig.from_hydra(raw)
