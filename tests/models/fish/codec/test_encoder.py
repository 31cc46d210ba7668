"""Firefly encode path (voice references): log-mel, backbone, FSQ, indices vs upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr
import torch

from streamtts.models.fish.codec.encoder import FireflyEncoder, encode_reference, to_codec_input
from streamtts.models.fish.codec.firefly import Firefly, load_firefly
from streamtts.models.fish.codec.mel import (
    hz_to_slaney_mel,
    slaney_mel_filterbank,
    slaney_mel_to_hz,
)
from tests.fish_fixture import expected

MEL_TOL = 1e-3  # max abs in ln units (values span about -11.5 .. 3)
BACKBONE_TOL = 1e-3
PRE_ROUND_TOL = 1e-3  # fixture's min distance to a rounding boundary is 4.5e-3
MIN_INDEX_AGREEMENT = 0.99


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def encoder(fish_fixture_dir: Path) -> FireflyEncoder:
    model: Firefly = load_firefly(fish_fixture_dir, with_encoder=True)
    assert model.encoder is not None
    return model.encoder


@pytest.fixture(scope="module")
def audio(fish_fixture_dir: Path, fish_index: dict[str, Any]) -> torch.Tensor:
    return torch.from_numpy(expected(fish_fixture_dir, fish_index, "encode_input.npy"))  # [L]


def test_log_mel_matches_upstream(
    encoder: FireflyEncoder, audio: torch.Tensor, fish_fixture_dir: Path, fish_index: dict[str, Any]
) -> None:
    want = expected(fish_fixture_dir, fish_index, "encode_mel.npy")
    got = encoder.spectrogram(audio[None])[0].numpy()  # [n_mels, L // hop]
    assert got.shape == want.shape == (160, audio.shape[0] // 512)
    assert np.abs(got - want).max() <= MEL_TOL


def test_backbone_matches_upstream(
    encoder: FireflyEncoder, fish_fixture_dir: Path, fish_index: dict[str, Any]
) -> None:
    mel = torch.from_numpy(expected(fish_fixture_dir, fish_index, "encode_mel.npy"))
    want = expected(fish_fixture_dir, fish_index, "encode_backbone.npy")
    with torch.inference_mode():
        got = encoder.backbone(mel[None])[0].numpy()
    assert np.abs(got - want).max() <= BACKBONE_TOL


def test_fsq_pre_round_matches_upstream(
    encoder: FireflyEncoder, fish_fixture_dir: Path, fish_index: dict[str, Any]
) -> None:
    feats = torch.from_numpy(expected(fish_fixture_dir, fish_index, "encode_backbone.npy"))
    want = expected(fish_fixture_dir, fish_index, "encode_fsq_pre_round.npy")
    with torch.inference_mode():
        got = encoder.fsq.pre_round(encoder.downsample(feats[None]))[0].numpy()  # [G, T, 4]
    assert np.abs(got - want).max() <= PRE_ROUND_TOL


def test_indices_match_upstream(
    encoder: FireflyEncoder, audio: torch.Tensor, fish_fixture_dir: Path, fish_index: dict[str, Any]
) -> None:
    want = expected(fish_fixture_dir, fish_index, "encode_indices.npy")
    got = encode_reference(encoder, audio.numpy(), 44100)
    assert got.dtype == torch.int32 and tuple(got.shape) == want.shape
    assert (got.numpy() == want).mean() >= MIN_INDEX_AGREEMENT
    assert int(got.min()) >= 0 and int(got.max()) < 1000


def test_channels_and_int_pcm_are_mixed_down(encoder: FireflyEncoder, audio: torch.Tensor) -> None:
    mono = encode_reference(encoder, audio.numpy(), 44100)
    stereo = np.stack([audio.numpy(), audio.numpy()], axis=1)  # [L, 2]
    assert torch.equal(encode_reference(encoder, stereo, 44100), mono)
    pcm16 = np.round(audio.numpy() * 32768).clip(-32768, 32767).astype(np.int16)
    assert (encode_reference(encoder, pcm16, 44100) == mono).float().mean() >= 0.95


def test_other_rates_are_resampled(encoder: FireflyEncoder, audio: torch.Tensor) -> None:
    at_48k = soxr.resample(audio.numpy(), 44100, 48000).astype(np.float32)
    back = to_codec_input(at_48k, 48000, 44100)
    assert back.shape[0] == pytest.approx(audio.shape[0], abs=2)
    # The band below ~20 kHz survives the round trip (soxr's passband), so the mel mostly does.
    mel_orig = encoder.spectrogram(audio[None])[0, :140]
    mel_back = encoder.spectrogram(back[None, : audio.shape[0]])[0, :140]
    assert (mel_orig - mel_back).abs().median() < 0.05
    got = encode_reference(encoder, at_48k, 48000)
    with torch.inference_mode():
        want = encoder(back[None])[0]
    assert torch.equal(got, want)
    assert encode_reference(encoder, at_48k, 44100).shape[1] > got.shape[1]  # rate matters


def test_bad_audio_is_rejected(encoder: FireflyEncoder) -> None:
    with pytest.raises(ValueError):
        encode_reference(encoder, np.zeros((2, 3, 4), np.float32), 44100)
    with pytest.raises(ValueError):
        encode_reference(encoder, np.zeros(100, np.float32), 44100)


def test_slaney_scale() -> None:
    hz = torch.tensor([0.0, 500.0, 1000.0, 6400.0, 22050.0], dtype=torch.float64)
    mel = hz_to_slaney_mel(hz)
    assert mel[1].item() == pytest.approx(7.5)  # linear part: 3 mel per 200 Hz
    assert mel[2].item() == pytest.approx(15.0)
    assert mel[3].item() == pytest.approx(15.0 + 27.0)  # 27 mel per factor 6.4 above 1 kHz
    torch.testing.assert_close(slaney_mel_to_hz(mel), hz)


def test_slaney_filterbank_shape_and_area() -> None:
    bank = slaney_mel_filterbank(1025, 0.0, 22050.0, 160, 44100)  # [F, M]
    assert bank.shape == (1025, 160) and bank.min() >= 0
    bin_hz = 22050.0 / 1024
    area = bank.double().sum(dim=0) * bin_hz  # ≈ 1 for filters much wider than a bin
    assert torch.allclose(area[80:], torch.ones(80, dtype=torch.float64), atol=0.02)
    peaks = bank.argmax(dim=0)
    assert bool((peaks[1:] >= peaks[:-1]).all())
