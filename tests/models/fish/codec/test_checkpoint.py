"""Loading generator checkpoints: key styles, prefixes, nesting, config override, sizes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from streamtts.models.fish.codec.checkpoint import fold_weight_norm, read_generator_state_dict
from streamtts.models.fish.codec.config import VocoderConfig, load_vocoder_config
from streamtts.models.fish.codec.decoder import FireflyDecoder
from streamtts.models.fish.codec.encoder import FireflyEncoder
from streamtts.models.fish.codec.firefly import GENERATOR_FILENAME as GENERATOR
from streamtts.models.fish.codec.firefly import load_firefly
from tests.fish_fixture import Index, codes_for, expected, fp32_decodes

FP32_TOL = 1e-4
NEW_G, NEW_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
# Released model, spec §5.8: 47,065,218 parameters in weight-norm form; folding drops one g
# per weight-normed conv: conv_pre 512 + ups 992 + resblocks 18 * 496 + conv_post 1 = 10,433.
RELEASED_PARAMS_FOLDED = 47_065_218 - 10_433

StateDict = dict[str, torch.Tensor]


pytestmark = pytest.mark.usefixtures("single_thread")


def original(fixture_dir: Path) -> StateDict:
    sd: StateDict = torch.load(fixture_dir / GENERATOR, map_location="cpu", weights_only=True)
    assert any(k.endswith(NEW_G) for k in sd), "fixture should use the new weight-norm API"
    return sd


def old_api(sd: StateDict) -> object:
    renamed = {}
    for key, value in sd.items():
        key = key.replace(NEW_G, ".weight_g").replace(NEW_V, ".weight_v")
        renamed[key] = value
    return renamed


def folded(sd: StateDict) -> object:
    out = {}
    for key, value in sd.items():
        if key.endswith(NEW_G):
            base = key.removesuffix(NEW_G)
            # torch's own weight-norm kernel as an independent oracle
            out[base + ".weight"] = torch._weight_norm(sd[base + NEW_V], value, 0)
        elif not key.endswith(NEW_V):
            out[key] = value
    return out


def prefixed_nested(sd: StateDict) -> object:
    generator = {f"generator.{k}": v for k, v in sd.items()}
    others = {"discriminator.conv.weight": torch.zeros(3), "generator_steps": torch.tensor(5)}
    return {"state_dict": {**generator, **others}, "epoch": 3}


def prefixed_flat(sd: StateDict) -> object:
    return {f"generator.{k}": v for k, v in sd.items()}


STYLES: dict[str, Callable[[StateDict], object]] = {
    "new_api": lambda sd: sd,
    "weight_g_v": old_api,
    "plain_weight": folded,
    "generator_prefix_nested": prefixed_nested,
    "generator_prefix_flat": prefixed_flat,
}


@pytest.mark.parametrize("style", list(STYLES))
def test_key_styles_decode_identically(
    fish_fixture_dir: Path, fish_index: Index, tmp_path: Path, style: str
) -> None:
    torch.save(STYLES[style](original(fish_fixture_dir)), tmp_path / GENERATOR)
    shutil.copy(fish_fixture_dir / "vocoder_config.json", tmp_path / "vocoder_config.json")
    model = load_firefly(tmp_path / GENERATOR, with_encoder=style == "new_api")
    for name in fp32_decodes(fish_index):
        codes = codes_for(fish_fixture_dir, fish_index, name)
        want = expected(fish_fixture_dir, fish_index, name)
        with torch.inference_mode():
            got = model.decoder(codes[None])[0, 0].numpy()
        assert np.abs(got - want).max() <= FP32_TOL, name


def test_transposed_conv_weight_norm_is_per_input_channel(fish_fixture_dir: Path) -> None:
    sd = original(fish_fixture_dir)
    g, v = sd["head.ups.0.conv" + NEW_G], sd["head.ups.0.conv" + NEW_V]  # [in,1,1], [in,out,k]
    w = fold_weight_norm(g, v)
    assert w.shape == v.shape
    torch.testing.assert_close(w.flatten(1).norm(dim=1), g.flatten().abs())
    folded_sd = read_generator_state_dict(fish_fixture_dir / GENERATOR)
    torch.testing.assert_close(folded_sd["head.ups.0.conv.weight"], w)


def test_released_config_rejects_the_tiny_weights(fish_fixture_dir: Path, tmp_path: Path) -> None:
    """Without vocoder_config.json the released hyper-parameters apply; shapes then mismatch."""
    shutil.copy(fish_fixture_dir / GENERATOR, tmp_path / GENERATOR)
    assert load_vocoder_config(tmp_path / GENERATOR) == VocoderConfig()
    with pytest.raises(ValueError, match="vocoder_config"):
        load_firefly(tmp_path)


def test_missing_weights_are_an_error(fish_fixture_dir: Path, tmp_path: Path) -> None:
    sd = original(fish_fixture_dir)
    del sd["head.conv_post.conv.bias"]
    torch.save(sd, tmp_path / GENERATOR)
    shutil.copy(fish_fixture_dir / "vocoder_config.json", tmp_path / "vocoder_config.json")
    with pytest.raises(ValueError, match="missing.*conv_post"):
        load_firefly(tmp_path)


def test_config_override_from_fixture(fish_fixture_dir: Path) -> None:
    raw = json.loads((fish_fixture_dir / "vocoder_config.json").read_text())
    cfg = load_vocoder_config(fish_fixture_dir / GENERATOR)
    assert cfg.encoder.dims == tuple(raw["backbone"]["dims"])
    assert cfg.head.upsample_initial_channel == raw["head"]["upsample_initial_channel"]
    assert cfg.quantizer.input_dim == raw["quantizer"]["input_dim"]
    assert cfg.samples_per_code == 2048 and cfg.codebook_size == 1000


def test_released_architecture_size() -> None:
    cfg = VocoderConfig()
    assert cfg.samples_per_code == 2048 and cfg.sample_rate == 44100
    with torch.device("meta"):
        decoder, encoder = FireflyDecoder(cfg), FireflyEncoder(cfg)
    n_dec = sum(p.numel() for p in decoder.parameters())
    n_enc = sum(p.numel() for p in encoder.parameters())
    assert n_dec + n_enc == RELEASED_PARAMS_FOLDED
    # spec §5.8: backbone 19,447,808; quantizer 10,525,216 (no weight norm in either)
    n_backbone = sum(p.numel() for p in encoder.backbone.parameters())
    assert n_backbone == 19_447_808
    n_quantizer = n_dec + n_enc - n_backbone - sum(p.numel() for p in decoder.head.parameters())
    assert n_quantizer == 10_525_216
