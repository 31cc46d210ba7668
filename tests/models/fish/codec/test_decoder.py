"""Firefly decode parity with the upstream implementation's outputs (the Fish fixture set).

Cases come from ``expected/index.json``: every fp32 decode (``dec_audio*_fp32``,
``gen_<case>_fp32_audio``), every latent (``dec_latent*``), every bf16-autocast decode, and each
group of independently decoded chunks; which codes each decoded is read from its recorded call.
"""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from streamtts.models.fish.codec.blocks import CausalConv1d, CausalConvTranspose1d
from streamtts.models.fish.codec.firefly import Firefly, load_firefly
from streamtts.models.fish.codec.incremental import IncrementalDecoder
from streamtts.models.fish.fused.pairs import why_not_paired
from streamtts.models.fish.packed import packs, packs_fp32
from tests.fish_fixture import (
    FP32_DECODE,
    Index,
    codes_for,
    decode_source,
    entries,
    expected,
    fp32_decodes,
)

pytestmark = pytest.mark.usefixtures("single_thread")

FP32_TOL = 1e-4  # max abs, fp32 vs upstream fp32
# bf16: upstream's own bf16-autocast decode differs from its fp32 one by ~0.024 max / 0.002 rms
# on this fixture; two independent bf16 roundings may differ by about twice that.
BF16_MAX_TOL = 0.06
BF16_RMS_TOL = 0.005

LATENT = r"dec_latent(_\w+)?_fp32\.npy"
BF16_AUTOCAST = r"dec_audio(_\w+)?_bf16autocast\.npy"
CHUNK = re.compile(r"dec_audio_chunk(\d+)_fp32\.npy")


@pytest.fixture(scope="module")
def firefly(fish_fixture_dir: Path) -> Firefly:
    return load_firefly(fish_fixture_dir, with_encoder=False)


@pytest.mark.parametrize("name", entries(FP32_DECODE))
def test_fp32_decode_matches_upstream(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: Index, name: str
) -> None:
    codes = codes_for(fish_fixture_dir, fish_index, name)
    want = expected(fish_fixture_dir, fish_index, name)
    with torch.inference_mode():
        got = firefly.decoder(codes[None])[0, 0].numpy()  # [N * 2048]
    assert got.shape == want.shape == (codes.shape[1] * firefly.config.samples_per_code,)
    assert np.abs(got - want).max() <= FP32_TOL


@pytest.mark.parametrize("name", entries(LATENT))
def test_latent_matches_upstream(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: Index, name: str
) -> None:
    codes = codes_for(fish_fixture_dir, fish_index, name)
    want = expected(fish_fixture_dir, fish_index, name)
    with torch.inference_mode():
        got = firefly.decoder.latent(codes[None])[0].numpy()  # [C, 4N]
    assert np.abs(got - want).max() <= FP32_TOL


def test_upstream_chunking_leaves_a_seam(fish_fixture_dir: Path, fish_index: Index) -> None:
    """Guards the premise of incremental decoding: zero-state chunks != the whole decode.

    Every group of ``dec_audio_chunk<i>_fp32`` entries is checked against the fp32 decode of
    the whole codes file they slice, the chunks in frame order."""
    groups: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for name in fish_index["files"]:
        if CHUNK.fullmatch(name):
            codes_file, frames = decode_source(fish_index, name)
            groups[codes_file].append((frames.start, name))
    assert groups, "the fixture set has no independently decoded chunks (dec_audio_chunk*)"
    wholes = {}
    for name in fp32_decodes(fish_index):
        codes_file, frames = decode_source(fish_index, name)
        if frames == slice(None):
            wholes[codes_file] = name
    for codes_file, chunks in groups.items():
        whole = wholes.get(codes_file)
        assert whole is not None, f"no fp32 decode of the whole of {codes_file}"
        full = expected(fish_fixture_dir, fish_index, whole)
        joined = np.concatenate(
            [expected(fish_fixture_dir, fish_index, name) for _, name in sorted(chunks)]
        )
        assert joined.shape == full.shape
        assert np.abs(joined - full).max() > 100 * FP32_TOL


def _bf16_close(got: np.ndarray, want: np.ndarray) -> None:
    assert np.abs(got - want).max() <= BF16_MAX_TOL
    assert np.sqrt(np.mean((got - want) ** 2)) <= BF16_RMS_TOL


@pytest.mark.parametrize("name", entries(BF16_AUTOCAST))
def test_bf16_autocast_close_to_upstream_bf16(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: Index, name: str
) -> None:
    codes = codes_for(fish_fixture_dir, fish_index, name)
    want = expected(fish_fixture_dir, fish_index, name)
    with torch.inference_mode():
        fp32 = firefly.decoder(codes[None])[0, 0].numpy()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = firefly.decoder(codes[None])[0, 0].float().numpy()
    _bf16_close(got, want)
    assert np.abs(got - fp32).max() > 1e-4  # really ran in bf16


@pytest.mark.parametrize(
    ("autocast", "row_convs"),
    [(False, False), (True, False), (False, True)],
    ids=["cast", "autocast", "row_conv"],
)
def test_bf16_incremental_close_to_fp32(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: Index, autocast: bool, row_convs: bool
) -> None:
    """Every fp32 decode of the set, redone in bf16 chunks of 8 frames from a fresh state: cast
    (oneDNN's convolutions where it packs), autocast, and the fused ops' ``row_conv``."""
    if row_convs and (why_not := why_not_paired()) is not None:
        pytest.skip(why_not)
    dec = IncrementalDecoder(
        firefly.decoder, "cpu", torch.bfloat16, autocast=autocast, row_convs=row_convs
    )
    assert (dec.row_convs > 0) == row_convs
    for name in fp32_decodes(fish_index):
        codes = codes_for(fish_fixture_dir, fish_index, name)
        want = expected(fish_fixture_dir, fish_index, name)
        state = dec.new_state()
        pieces = [
            dec.decode([state], [codes[:, i : i + 8]])[0] for i in range(0, codes.shape[1], 8)
        ]
        got = torch.cat(pieces)
        assert got.dtype == torch.float32
        _bf16_close(got.numpy(), want)
    # The fp32 decoder handed in is not modified by the bf16 wrapper.
    assert next(firefly.decoder.parameters()).dtype == torch.float32


CPU = torch.device("cpu")
CONVS = (CausalConv1d, CausalConvTranspose1d)
# Packed decoders: bf16 where oneDNN has bf16 kernels; fp32 (``pack_fp32``: ``dtype auto`` and
# int8 without native bf16) wherever it has oneDNN, so every CPU runs one of them.
PACKED_DTYPES = [
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(not packs(CPU, torch.bfloat16), reason="no oneDNN bf16 kernels"),
        id="bf16",
    ),
    pytest.param(
        torch.float32,
        marks=pytest.mark.skipif(not packs_fp32(CPU, torch.float32), reason="no oneDNN"),
        id="fp32",
    ),
]


def _rounding_close(dtype: torch.dtype, got: np.ndarray, want: np.ndarray) -> None:
    if dtype == torch.float32:
        assert np.abs(got - want).max() <= FP32_TOL
    else:
        _bf16_close(got, want)


@pytest.mark.parametrize("dtype", PACKED_DTYPES)
@pytest.mark.parametrize("name", entries(FP32_DECODE))
def test_packed_decoder_within_a_rounding_of_the_unpacked_one(
    firefly: Firefly, fish_fixture_dir: Path, fish_index: Index, name: str, dtype: torch.dtype
) -> None:
    codes = codes_for(fish_fixture_dir, fish_index, name)
    fp32 = expected(fish_fixture_dir, fish_index, name)
    audio = {}
    for pack in (True, False):
        dec = IncrementalDecoder(firefly.decoder, "cpu", dtype, pack=pack, pack_fp32=True)
        assert dec.packed is pack
        state = dec.new_state()
        frames = codes.shape[1]
        chunks = [dec.decode([state], [codes[:, i : i + 8]])[0] for i in range(0, frames, 8)]
        audio[pack] = torch.cat(chunks).numpy()
    assert not np.array_equal(audio[True], audio[False])  # the packed kernels really ran
    if dtype == torch.bfloat16:
        # Each is a bf16 rendering of upstream's fp32 audio; the packed one is no further from
        # it. (In fp32 both errors are float roundings, ~1e-7, their ratio noise.)
        errors = {pack: np.sqrt(np.mean((a - fp32) ** 2)) for pack, a in audio.items()}
        assert errors[True] <= 1.5 * errors[False], errors
    _rounding_close(dtype, audio[True], audio[False])
    _rounding_close(dtype, audio[True], fp32)


def test_fp32_packs_only_when_asked_the_parity_mode_does_not(firefly: Firefly) -> None:
    assert not IncrementalDecoder(firefly.decoder, "cpu", torch.float32).packed
    asked = IncrementalDecoder(firefly.decoder, "cpu", torch.float32, pack_fp32=True)
    assert asked.packed is packs_fp32(CPU, torch.float32)


@pytest.mark.skipif(not packs_fp32(CPU, torch.float32), reason="no oneDNN")
def test_packing_copies_the_callers_decoder_unless_given_it(firefly: Firefly) -> None:
    def packed_convs(decoder: torch.nn.Module) -> int:
        return sum(getattr(m, "packed", None) is not None for m in decoder.modules())

    copied = IncrementalDecoder(firefly.decoder, "cpu", torch.float32, pack_fp32=True)
    assert copied.decoder is not firefly.decoder and packed_convs(copied.decoder) > 0
    assert packed_convs(firefly.decoder) == 0
    own = copy.deepcopy(firefly.decoder)
    given = IncrementalDecoder(own, "cpu", torch.float32, pack_fp32=True, in_place=True)
    assert given.decoder is own and packed_convs(own) == packed_convs(copied.decoder)


@pytest.mark.parametrize("dtype", PACKED_DTYPES)
def test_packed_layers_drop_their_plain_weights(firefly: Firefly, dtype: torch.dtype) -> None:
    """A packed convolution holds its weight once, packed: the plain one is an empty
    placeholder of the decoder's dtype, and a plain use of it fails instead of computing."""
    dec = IncrementalDecoder(firefly.decoder, "cpu", dtype, pack_fp32=True)
    packed = [m for m in dec.decoder.modules() if isinstance(m, CONVS) and m.packed is not None]
    assert {type(m) for m in packed} == set(CONVS)
    for module in packed:
        assert module.conv.weight.numel() == 0 and module.conv.weight.dtype == dtype
    # Packing a packed decoder again (its packed weights cannot be copied) leaves it as it is.
    again = IncrementalDecoder(dec.decoder, "cpu", dtype, pack_fp32=True, in_place=True)
    state = again.new_state()
    codes = torch.randint(0, 1000, (8, 4), generator=torch.Generator().manual_seed(2))
    assert torch.equal(again.decode([state], [codes])[0], dec.decode([dec.new_state()], [codes])[0])
    layer = packed[0]
    layer.packed = None
    with pytest.raises(RuntimeError):
        layer(torch.zeros(1, layer.in_channels, 4, dtype=dtype))


@pytest.mark.parametrize("dtype", PACKED_DTYPES)
def test_packed_decoder_batches_ragged_streams_like_single_ones(
    firefly: Firefly, dtype: torch.dtype
) -> None:
    dec = IncrementalDecoder(firefly.decoder, "cpu", dtype, pack_fp32=True)
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
        _rounding_close(dtype, torch.cat(pieces[b]).numpy(), alone[b].numpy())


def test_output_is_bounded(firefly: Firefly) -> None:
    codes = torch.randint(0, firefly.config.codebook_size, (1, 8, 12))
    with torch.inference_mode():
        audio = firefly.decoder(codes)
    assert audio.shape == (1, 1, 12 * firefly.config.samples_per_code)
    assert torch.isfinite(audio).all() and audio.abs().max() < 1
