"""Incremental decoding equals one-shot decoding, batched across streams; bad codes are safe."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamtts.models.fish.codec.conv_state import LeftContext, is_time_major
from streamtts.models.fish.codec.firefly import Firefly, load_firefly
from streamtts.models.fish.codec.fsq import FsqLattice
from streamtts.models.fish.codec.incremental import (
    DecoderState,
    IncrementalDecoder,
    out_of_range_codes_total,
)

EXACT_TOL = 1e-5  # fp32 max abs: chunked vs one-shot (only summation order may differ)


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def firefly(fish_fixture_dir: Path) -> Firefly:
    return load_firefly(fish_fixture_dir, with_encoder=False)


@pytest.fixture(scope="module")
def decoder(firefly: Firefly) -> IncrementalDecoder:
    return IncrementalDecoder(firefly.decoder, "cpu", torch.float32)


def random_codes(frames: int, seed: int, high: int = 1000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (8, frames), generator=gen)  # [8, N]


def one_shot(firefly: Firefly, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        audio: torch.Tensor = firefly.decoder(codes[None])[0, 0]  # [N * 2048]
    return audio


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


@pytest.mark.parametrize("chunk", [1, 3, 8, 17])
def test_single_stream_chunks_equal_one_shot(
    firefly: Firefly, decoder: IncrementalDecoder, chunk: int
) -> None:
    codes = random_codes(37, seed=chunk)
    state = decoder.new_state()
    pieces = []
    for start in range(0, codes.shape[1], chunk):
        (pcm,) = decoder.decode([state], [codes[:, start : start + chunk]])
        assert pcm.shape == (min(chunk, codes.shape[1] - start) * 2048,)
        pieces.append(pcm)
    assert state.frames_decoded == 37
    assert max_diff(torch.cat(pieces), one_shot(firefly, codes)) <= EXACT_TOL


@pytest.mark.parametrize("chunk", [1, 3, 8, 17])
def test_streams_of_different_lengths_batched(
    firefly: Firefly, decoder: IncrementalDecoder, chunk: int
) -> None:
    """Three streams, same chunk size per call, different lengths and start times."""
    lengths, starts = [29, 41, 18], [0, 5, 11]  # stream b joins at call starts[b]
    codes = [random_codes(n, seed=100 + b) for b, n in enumerate(lengths)]
    states = [decoder.new_state() for _ in lengths]
    pos = [0, 0, 0]
    pieces: list[list[torch.Tensor]] = [[], [], []]
    call = 0
    while any(p < n for p, n in zip(pos, lengths, strict=True)):
        live = [b for b in range(3) if call >= starts[b] and pos[b] < lengths[b]]
        if live:
            chunks = [codes[b][:, pos[b] : pos[b] + chunk] for b in live]
            out = decoder.decode([states[b] for b in live], chunks)
            for b, c, pcm in zip(live, chunks, out, strict=True):
                pieces[b].append(pcm)
                pos[b] += c.shape[1]
        call += 1
    for b in range(3):
        assert max_diff(torch.cat(pieces[b]), one_shot(firefly, codes[b])) <= EXACT_TOL


def test_ragged_chunk_sizes_in_one_batch(firefly: Firefly, decoder: IncrementalDecoder) -> None:
    """Each call gives every stream a different number of new frames (including zero)."""
    plans = [[1, 4, 0, 7, 2, 3], [5, 0, 2, 2, 9, 1], [3, 3, 3, 0, 1, 6]]
    codes = [random_codes(sum(p), seed=200 + b) for b, p in enumerate(plans)]
    states = [decoder.new_state() for _ in plans]
    pos = [0, 0, 0]
    pieces: list[list[torch.Tensor]] = [[], [], []]
    for step in range(len(plans[0])):
        sizes = [p[step] for p in plans]
        chunks = [codes[b][:, pos[b] : pos[b] + n] for b, n in enumerate(sizes)]
        out = decoder.decode(states, chunks)
        for b, n in enumerate(sizes):
            assert out[b].shape == (n * 2048,)
            pieces[b].append(out[b])
            pos[b] += n
    for b in range(3):
        assert max_diff(torch.cat(pieces[b]), one_shot(firefly, codes[b])) <= EXACT_TOL


def test_incremental_is_not_zero_state_chunking(
    firefly: Firefly, decoder: IncrementalDecoder
) -> None:
    """Unlike upstream's per-chunk decode, the second chunk depends on the first."""
    codes = random_codes(16, seed=7)
    state = decoder.new_state()
    decoder.decode([state], [codes[:, :8]])
    (second,) = decoder.decode([state], [codes[:, 8:]])
    assert max_diff(second, one_shot(firefly, codes[:, 8:])) > 1e-3


def test_reset_starts_a_fresh_stream(firefly: Firefly, decoder: IncrementalDecoder) -> None:
    codes = random_codes(6, seed=8)
    state = decoder.new_state()
    decoder.decode([state], [random_codes(5, seed=9)])
    decoder.reset(state)
    assert state.frames_decoded == 0
    (pcm,) = decoder.decode([state], [codes])
    assert max_diff(pcm, one_shot(firefly, codes)) <= EXACT_TOL


def test_out_of_range_codes_are_replaced_and_counted(
    firefly: Firefly, decoder: IncrementalDecoder
) -> None:
    lattice = FsqLattice(firefly.config.quantizer.levels)
    assert lattice.size == firefly.config.codebook_size
    codes = random_codes(10, seed=11)
    bad = codes.clone()
    bad[0, 2], bad[3, 5], bad[7, 9], bad[5, 0] = 1000, 1023, 1017, -1
    before = out_of_range_codes_total.value()
    state = decoder.new_state()
    pieces = [decoder.decode([state], [bad[:, i : i + 3]])[0] for i in range(0, 10, 3)]
    assert out_of_range_codes_total.value() - before == 4
    got = torch.cat(pieces)
    assert torch.isfinite(got).all()
    neutral = codes.clone()
    neutral[bad != codes] = lattice.neutral_index
    assert max_diff(got, one_shot(firefly, neutral)) <= EXACT_TOL
    # The neutral code is the lattice centre, not a clamp to the last entry.
    clamped = bad.clamp(0, lattice.size - 1)
    assert max_diff(got, one_shot(firefly, clamped)) > 1e-4


def test_padding_of_ragged_batches_is_not_counted(decoder: IncrementalDecoder) -> None:
    before = out_of_range_codes_total.value()
    states = [decoder.new_state(), decoder.new_state()]
    decoder.decode(states, [random_codes(1, seed=12), random_codes(4, seed=13)])
    assert out_of_range_codes_total.value() == before


def test_bad_shapes_are_rejected(decoder: IncrementalDecoder) -> None:
    state = decoder.new_state()
    with pytest.raises(ValueError):
        decoder.decode([state], [torch.zeros(7, 3, dtype=torch.long)])
    with pytest.raises(ValueError):
        decoder.decode([state, decoder.new_state()], [torch.zeros(8, 3, dtype=torch.long)])


def test_state_shapes(decoder: IncrementalDecoder, firefly: Firefly) -> None:
    state = decoder.new_state()
    assert isinstance(state, DecoderState)
    widths = [t.shape[1] for t in state.context]
    # conv_pre (k13) keeps 12 columns; a k11 d5 resblock conv keeps 50; the ConvNeXt dwconv 6.
    assert 12 in widths and 50 in widths and 6 in widths
    assert len(state.context) == len(firefly.decoder.context_shapes)


def test_receptive_field_is_15_frames(firefly: Firefly) -> None:
    """Spec §5.7: the audio of frame t depends on frames t-15 .. t only (what makes caching
    bounded state sufficient)."""
    codes = random_codes(24, seed=14)
    changed = codes.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 1000
    diff = (one_shot(firefly, codes) - one_shot(firefly, changed)).abs().view(24, 2048)
    per_frame = diff.max(dim=1).values
    assert float(per_frame[:3].max()) == 0.0  # causal: nothing before the change moves
    assert float(per_frame[3 + 15]) > 0.0
    assert float(per_frame[3 + 16 :].max()) == 0.0


def test_left_context_joins_time_major_tensors_in_their_layout() -> None:
    plain = torch.randn(2, 4, 6)  # [B, C, T]
    time_major = (
        plain.transpose(1, 2).contiguous().transpose(1, 2)
    )  # same values, [B, T, C] storage
    assert is_time_major(time_major) and not is_time_major(plain)
    assert not is_time_major(plain[:, :, :1])  # one column: both layouts are the same
    past = torch.randn(2, 4, 3)
    joined = {}
    for name, x in (("plain", plain), ("time_major", time_major)):
        ctx = LeftContext([past], [1, 1])
        joined[name] = ctx.extend(0, x)
        assert torch.equal(ctx.next[0], joined[name][:, :, -3:])
    assert torch.equal(joined["plain"], joined["time_major"])  # the same values either way
    assert is_time_major(joined["time_major"]) and not is_time_major(joined["plain"])
