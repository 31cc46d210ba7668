"""Firefly decode parity with the upstream implementation's outputs (fish15-tiny fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from streamtts.models.fish.firefly import Firefly, load_firefly
from streamtts.models.fish.incremental import IncrementalDecoder
from streamtts.models.fish.packed import packs

from .vocoder_expected import decode_source, expected, torch_threads

FP32_TOL = 1e-4  # max abs, fp32 vs upstream fp32
# bf16: upstream's own bf16-autocast decode differs from its fp32 one by ~0.024 max / 0.002 rms
# on this fixture; two independent bf16 roundings may differ by about twice that.
BF16_MAX_TOL = 0.06
BF16_RMS_TOL = 0.005

FP32_AUDIO = [
    "dec_audio_fp32.npy",
    "dec_audio_chunk0_fp32.npy",
    "dec_audio_chunk1_fp32.npy",
    "gen_en_fp32_audio.npy",
    "gen_zh_fp32_audio.npy",
]


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def firefly(fish_fixture_dir: Path) -> Firefly:
    return load_firefly(fish_fixture_dir, with_encoder=False)


def codes_for(fixture_dir: Path, index: dict[str, Any], audio_name: str) -> torch.Tensor:
    codes_file, frames = decode_source(index, audio_name)
    codes = expected(fixture_dir, index, codes_file)[:, frames]
    return torch.from_numpy(np.ascontiguousarray(codes)).long()  # [8, N]


@pytest.mark.parametrize("name", FP32_AUDIO)
def test_fp32_decode_matches_upstream(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: dict[str, Any], name: str
) -> None:
    codes = codes_for(fish_fixture_dir, fish_index, name)
    want = expected(fish_fixture_dir, fish_index, name)
    with torch.inference_mode():
        got = firefly.decoder(codes[None])[0, 0].numpy()  # [N * 2048]
    assert got.shape == want.shape == (codes.shape[1] * firefly.config.samples_per_code,)
    assert np.abs(got - want).max() <= FP32_TOL


def test_latent_matches_upstream(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: dict[str, Any]
) -> None:
    codes = torch.from_numpy(expected(fish_fixture_dir, fish_index, "dec_codes.npy"))
    want = expected(fish_fixture_dir, fish_index, "dec_latent_fp32.npy")
    with torch.inference_mode():
        got = firefly.decoder.latent(codes[None])[0].numpy()  # [C, 4N]
    assert np.abs(got - want).max() <= FP32_TOL


def test_upstream_chunking_leaves_a_seam(
    fish_fixture_dir: Path, fish_index: dict[str, Any]
) -> None:
    """Guards the premise of incremental decoding: zero-state chunks != the whole decode."""
    full = expected(fish_fixture_dir, fish_index, "dec_audio_fp32.npy")
    chunks = np.concatenate(
        [
            expected(fish_fixture_dir, fish_index, "dec_audio_chunk0_fp32.npy"),
            expected(fish_fixture_dir, fish_index, "dec_audio_chunk1_fp32.npy"),
        ]
    )
    assert np.abs(chunks - full).max() > 100 * FP32_TOL


def _bf16_close(got: np.ndarray, want: np.ndarray) -> None:
    assert np.abs(got - want).max() <= BF16_MAX_TOL
    assert np.sqrt(np.mean((got - want) ** 2)) <= BF16_RMS_TOL


def test_bf16_autocast_close_to_upstream_bf16(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: dict[str, Any]
) -> None:
    codes = torch.from_numpy(expected(fish_fixture_dir, fish_index, "dec_codes.npy"))
    want = expected(fish_fixture_dir, fish_index, "dec_audio_bf16autocast.npy")
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = firefly.decoder(codes[None])[0, 0].float().numpy()
    _bf16_close(got, want)
    fp32 = expected(fish_fixture_dir, fish_index, "dec_audio_fp32.npy")
    assert np.abs(got - fp32).max() > 1e-4  # really ran in bf16


@pytest.mark.parametrize("autocast", [False, True], ids=["cast", "autocast"])
def test_bf16_incremental_close_to_fp32(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: dict[str, Any], autocast: bool
) -> None:
    codes = torch.from_numpy(expected(fish_fixture_dir, fish_index, "dec_codes.npy"))
    want = expected(fish_fixture_dir, fish_index, "dec_audio_fp32.npy")
    dec = IncrementalDecoder(firefly.decoder, "cpu", torch.bfloat16, autocast=autocast)
    state = dec.new_state()
    pieces = [dec.decode([state], [codes[:, i : i + 8]])[0] for i in range(0, codes.shape[1], 8)]
    got = torch.cat(pieces)
    assert got.dtype == torch.float32
    _bf16_close(got.numpy(), want)
    # The fp32 decoder handed in is not modified by the bf16 wrapper.
    assert next(firefly.decoder.parameters()).dtype == torch.float32


@pytest.mark.skipif(
    not packs(torch.device("cpu"), torch.bfloat16), reason="this CPU's oneDNN has no bf16 kernels"
)
def test_packed_bf16_decoder_within_a_rounding_of_the_unpacked_one(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: dict[str, Any]
) -> None:
    codes = torch.from_numpy(expected(fish_fixture_dir, fish_index, "dec_codes.npy"))
    fp32 = expected(fish_fixture_dir, fish_index, "dec_audio_fp32.npy")
    audio = {}
    for pack in (True, False):
        dec = IncrementalDecoder(firefly.decoder, "cpu", torch.bfloat16, pack=pack)
        assert dec.packed is pack
        state = dec.new_state()
        chunks = [dec.decode([state], [codes[:, i : i + 8]])[0] for i in range(0, 24, 8)]
        audio[pack] = torch.cat(chunks).numpy()
    assert not np.array_equal(audio[True], audio[False])  # the packed kernels really ran
    # Each is a bf16 rendering of the fp32 audio; the packed one is no further from it.
    errors = {pack: np.sqrt(np.mean((a - fp32[: a.size]) ** 2)) for pack, a in audio.items()}
    assert errors[True] <= 1.5 * errors[False], errors
    _bf16_close(audio[True], audio[False])


@pytest.mark.skipif(
    not packs(torch.device("cpu"), torch.bfloat16), reason="this CPU's oneDNN has no bf16 kernels"
)
def test_packed_decoder_batches_ragged_streams_like_single_ones(firefly: Firefly) -> None:
    dec = IncrementalDecoder(firefly.decoder, "cpu", torch.bfloat16)
    assert dec.packed
    gen = torch.Generator().manual_seed(5)
    codes = [torch.randint(0, 1000, (8, 20), generator=gen) for _ in range(2)]
    alone = []
    for c in codes:
        state = dec.new_state()
        alone.append(torch.cat([dec.decode([state], [c[:, i : i + 5]])[0] for i in (0, 5, 10, 15)]))
    states = [dec.new_state(), dec.new_state()]
    pieces: list[list[torch.Tensor]] = [[], []]
    # Ragged: stream 0 brings 3 then 7 frames, stream 1 5 then 2 (then each the rest).
    for sizes in ((3, 5), (7, 2), (10, 13)):
        starts = [sum(len(p) for p in ps) // 2048 for ps in pieces]
        out = dec.decode(
            states, [c[:, s : s + n] for c, s, n in zip(codes, starts, sizes, strict=True)]
        )
        for b in range(2):
            pieces[b].append(out[b])
    for b in range(2):
        _bf16_close(torch.cat(pieces[b]).numpy(), alone[b].numpy())


def test_output_is_bounded(firefly: Firefly) -> None:
    codes = torch.randint(0, firefly.config.codebook_size, (1, 8, 12))
    with torch.inference_mode():
        audio = firefly.decoder(codes)
    assert audio.shape == (1, 1, 12 * firefly.config.samples_per_code)
    assert torch.isfinite(audio).all() and audio.abs().max() < 1
