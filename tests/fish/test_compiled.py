"""Compiled decode steps: the slow step (int8 on the CPU) gives the eager step's results,
written where eager writes them and nothing else in the cache touched; int8 graphs are cached
across starts; graphs are compiled around packed layers (calling them as they are); the
codebook pass pads a batch to its bucket; where timed, a bucket's graph, and each of the slow
step's two graphs, is kept only if faster than eager."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from streamtts.fish.compiled import (
    TIMING_ROUNDS,
    CompiledFastCodes,
    batch_buckets,
    compile_slow_step,
    compiles_slow_step,
    freezes_weights,
)
from streamtts.fish.devices import emulation_warning
from streamtts.fish.load import load_fish_bundle, prepare_llm
from streamtts.fish.settings import FishSettings
from streamtts.fish.spec import FishSpec
from streamtts.models.fish.llm.generate import fast_codes, frame_noise, slow_step
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache, SlowOutput, fuse_gate_up_
from streamtts.models.fish.llm.quantize import quantize_int8_
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams
from streamtts.models.fish.packed import PackedLinear, is_packed, packs

TINY = FishSpec("synthetic:tiny", synthetic_size="tiny")
BF16_PACKS = packs(torch.device("cpu"), torch.bfloat16)
# These compile an int8 model computing in bf16, as a CPU with native bf16 runs it. Where bf16 is
# emulated that costs CI over a minute (CI runs close to its 30-minute limit on such a host), and
# int8 computes in fp32 there: its compiled slow step in fp32 is not covered by these tests.
needs_native_bf16 = pytest.mark.skipif(
    emulation_warning(torch.bfloat16, torch.device("cpu")) is not None,
    reason="bf16 is emulated on this CPU (compiling it costs CI over a minute)",
)


def int8_model() -> DualARTransformer:
    model = load_fish_bundle(TINY, torch.device("cpu"), torch.bfloat16).llm.model
    fuse_gate_up_(model)
    quantize_int8_(model)
    return model


def filled_cache(model: DualARTransformer, slots: int) -> KVCache:
    cache = model.allocate_cache(slots, 256)
    gen = torch.Generator().manual_seed(3)
    for tensor in (cache.k, cache.v):
        tensor.copy_(torch.randn(tensor.shape, generator=gen).to(tensor.dtype))
    return cache


@needs_native_bf16
def test_compiled_slow_step_matches_eager_and_writes_only_its_positions() -> None:
    model = int8_model()
    assert compiles_slow_step(model)
    with torch.inference_mode():
        cache = model.allocate_cache(3, 256)
        compiled, compile_s, unused = compile_slow_step(model, cache, max_batch=3)
        assert sorted(compile_s) == ["slow_b1", "slow_b2"] and unused == []
        rows = model.config.num_codebooks + 1
        # Batch 1 and a batch of 3 (the dynamic graph), at cached lengths not seen in warm-up.
        for slots_list, positions_list in (([2], [100]), ([0, 2, 1], [70, 150, 9])):
            slots = torch.tensor(slots_list)
            positions = torch.tensor(positions_list)
            gen = torch.Generator().manual_seed(len(slots_list))
            shape = (len(slots_list), rows, 1)
            tokens = torch.randint(0, 300, shape, dtype=torch.int32, generator=gen)
            kv_len = max(positions_list) + 1
            eager_cache, compiled_cache = filled_cache(model, 3), filled_cache(model, 3)
            before = eager_cache.k.clone()
            want = slow_step(model, eager_cache, tokens, slots, positions, kv_len)
            got = compiled(model, compiled_cache, tokens, slots, positions, kv_len)
            for ours, theirs in ((got.logits, want.logits), (got.hidden, want.hidden)):
                error = float((ours.float() - theirs.float()).norm() / theirs.float().norm())
                assert error < 0.02, error  # bf16 roundings apart, no more
            # The same top token wherever eager's lead over its runner-up exceeds how far the
            # two differ (random weights have near-ties that any rounding may flip).
            top2 = want.logits.float().topk(2, dim=-1).values  # [B, 2]
            apart = (got.logits.float() - want.logits.float()).abs().amax(dim=-1)  # [B]
            clear = top2[:, 0] - top2[:, 1] > 2 * apart
            assert bool(clear.any())
            assert torch.equal(got.logits.argmax(-1)[clear], want.logits.argmax(-1)[clear])
            written = (eager_cache.k != before).any(dim=(0, 2, 4))  # [slots, max_seq]
            assert written.nonzero().tolist() == sorted(
                [s, p] for s, p in zip(slots_list, positions_list, strict=True)
            )
            for ours, theirs in (
                (compiled_cache.k, eager_cache.k),
                (compiled_cache.v, eager_cache.v),
            ):
                untouched = ~written[None, :, None, :, None].expand_as(ours)
                assert torch.equal(ours[untouched], theirs[untouched])
                torch.testing.assert_close(ours.float(), theirs.float(), atol=0.05, rtol=0.05)


@pytest.mark.parametrize(("setting", "compiles"), [("fp32", False), ("auto", True)])
def test_the_slow_step_compiles_with_packed_layers_not_in_the_parity_mode(
    setting: str, compiles: bool
) -> None:
    model = load_fish_bundle(TINY, torch.device("cpu"), torch.float32).llm.model
    prepare_llm(model, FishSettings(dtype=setting, compile=True))
    assert is_packed(model.layers) is compiles
    assert compiles_slow_step(model) is compiles


@pytest.mark.parametrize("slower_at", [[1], [1, 2], []])
def test_a_timed_slow_step_runs_each_graph_only_where_faster(
    slower_at: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timed at start, the slow step's graph for one row and the one for more are each kept
    only if faster than the eager step; each batch then runs what won (stand-ins for the
    graphs: instant, or slower than eager at the batch sizes in ``slower_at``)."""
    model = load_fish_bundle(TINY, torch.device("cpu"), torch.float32).llm.model
    prepare_llm(model, FishSettings(dtype="auto", compile=True))
    cache = model.allocate_cache(3, 128)  # the warm-up writes position 64
    graph_batches: list[int] = []

    def graph(
        model: DualARTransformer, cache: KVCache, tokens: torch.Tensor, *rest: Any
    ) -> SlowOutput:
        batch = int(tokens.shape[0])
        graph_batches.append(batch)
        if min(2, batch) in slower_at:
            time.sleep(0.02)
            return slow_step(model, cache, tokens, *rest)
        return SlowOutput(torch.zeros(batch, model.config.vocab_size), torch.zeros(batch, 1))

    monkeypatch.setattr(torch, "compile", lambda fn, **_: graph)
    with torch.inference_mode():
        step, compile_s, unused = compile_slow_step(model, cache, max_batch=3, timed=True)
        assert sorted(compile_s) == ["slow_b1", "slow_b2"]
        assert unused == [f"slow_b{b}" for b in slower_at]
        if slower_at == [1, 2]:
            assert step is slow_step
        rows = model.config.num_codebooks + 1
        for batch in (1, 3):
            tokens = torch.zeros(batch, rows, 1, dtype=torch.int32)
            graph_batches.clear()
            step(model, cache, tokens, torch.arange(batch), torch.full((batch,), 5), 6)
            assert graph_batches == ([] if min(2, batch) in slower_at else [batch])


def test_an_untimed_slow_step_keeps_its_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_fish_bundle(TINY, torch.device("cpu"), torch.float32).llm.model
    calls: list[int] = []

    def graph(model: DualARTransformer, cache: KVCache, tokens: torch.Tensor, *rest: Any) -> Any:
        calls.append(int(tokens.shape[0]))
        return slow_step(model, cache, tokens, *rest)

    monkeypatch.setattr(torch, "compile", lambda fn, **_: graph)
    with torch.inference_mode():
        step, _, unused = compile_slow_step(model, model.allocate_cache(2, 128), max_batch=2)
    assert step is graph and unused == [] and calls == [1, 2]  # compiled, never timed


@needs_native_bf16
def test_int8_graphs_are_cached_across_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unfrozen int8 graphs land in AOTAutograd's on-disk cache; a later start (here: dynamo
    reset) loads them instead of tracing them through AOTAutograd and inductor again."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = int8_model()
    assert not freezes_weights(model)
    aot = counters["aot_autograd"]
    with torch.inference_mode():
        torch._dynamo.reset()
        saved_before, hits_before = aot["autograd_cache_saved"], aot["autograd_cache_hit"]
        compile_slow_step(model, model.allocate_cache(2, 256), max_batch=1)
        assert aot["autograd_cache_saved"] == saved_before + 1
        torch._dynamo.reset()
        compile_slow_step(model, model.allocate_cache(2, 256), max_batch=1)
        assert aot["autograd_cache_hit"] == hits_before + 1
    torch._dynamo.reset()


@pytest.mark.parametrize(
    ("dtype", "setting", "packed", "frozen"),
    [
        # auto computing in fp32 (a CPU without native bf16): packed, compiled around them.
        (torch.float32, "auto", True, False),
        (torch.float32, "fp32", False, True),  # the parity mode packs nothing: inductor does
        (torch.float32, "int8", False, False),
        # bf16: packed where oneDNN has bf16 kernels, compiled around them; else frozen.
        (torch.bfloat16, "auto", BF16_PACKS, not BF16_PACKS),
    ],
)
def test_compile_runs_the_layers_packed_eagerly_except_in_the_parity_mode(
    dtype: torch.dtype, setting: str, packed: bool, frozen: bool
) -> None:
    model = load_fish_bundle(TINY, torch.device("cpu"), dtype).llm.model
    prepare_llm(model, FishSettings(dtype=setting, compile=True))
    assert is_packed(model.fast_layers) is packed
    assert freezes_weights(model) is frozen


def test_a_packed_layer_compiles_as_the_same_kernel_call() -> None:
    """Inductor lowers oneDNN's linear only for weights it packed itself; a packed layer is an
    opaque op in a graph, which gives eager's result bit for bit."""
    gen = torch.Generator().manual_seed(4)
    layer = PackedLinear(torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen))
    x = torch.randn(3, 32, generator=gen)

    def around(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(layer(x * 2.0)) + 1.0

    with torch.inference_mode():
        want = around(x)
        torch._dynamo.reset()
        got = torch.compile(around)(x)
    torch._dynamo.reset()
    assert torch.equal(got, want)


def tiny_codebook_inputs(model: DualARTransformer, batch: int) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(batch)
    hidden = torch.randn(batch, model.config.dim, generator=gen)
    code0 = torch.randint(0, model.config.codebook_size, (batch,), generator=gen)
    sampling = BatchSampling.from_params([SamplingParams()] * batch)
    windows = torch.zeros(batch, model.config.num_codebooks + 1, 16, dtype=torch.long)
    return hidden, code0, sampling, windows, frame_noise(model, batch).fast


@pytest.mark.parametrize("graph_faster", [True, False])
def test_a_timed_bucket_keeps_its_graph_only_if_faster(graph_faster: bool) -> None:
    """A timed warm-up runs each bucket's graph against the eager pass, alternately, and
    routes a bucket to whichever was faster (stand-ins for the graphs: instant, or slower)."""
    model = load_fish_bundle(TINY, torch.device("cpu"), torch.float32).llm.model
    cache = model.allocate_cache(2, 64)
    codes = CompiledFastCodes(max_batch=2, device=model.device, timed=True)
    graph_calls: list[int] = []

    def graph(model: DualARTransformer, cache: KVCache, *args: Any) -> torch.Tensor:
        graph_calls.append(int(args[0].shape[0]))
        if graph_faster:
            return torch.zeros(args[0].shape[0], model.config.num_codebooks - 1, dtype=torch.long)
        time.sleep(0.05)
        return fast_codes(model, cache, *args)

    codes._compiled = graph
    with torch.inference_mode():
        codes.warm_up(model, cache)
        assert sorted(codes.pass_ms) == [1, 2]
        for compiled_ms, eager_ms in codes.pass_ms.values():
            assert (compiled_ms < eager_ms) is graph_faster
        assert codes.compiled_buckets == ([1, 2] if graph_faster else [])
        assert codes.eager == (set() if graph_faster else {1, 2})
        timed_calls = len(graph_calls)
        assert timed_calls >= 2 * TIMING_ROUNDS  # every bucket: warm-up, warm, timed rounds
        codes(model, cache, *tiny_codebook_inputs(model, 2))
    assert len(graph_calls) == timed_calls + (1 if graph_faster else 0)


def test_batch_buckets_are_powers_of_two_then_the_slots() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(4) == [1, 2, 4]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]


def test_codebook_pass_pads_a_batch_to_its_bucket_and_returns_its_rows() -> None:
    model = load_fish_bundle(TINY, torch.device("cpu"), torch.float32).llm.model
    cache = model.allocate_cache(6, 64)
    codes = CompiledFastCodes(max_batch=6, device=model.device)
    seen_batches: list[int] = []

    def eager_graph(*args: Any) -> torch.Tensor:  # stands in for a bucket's compiled graph
        seen_batches.append(int(args[2].shape[0]))
        return fast_codes(model, *args[1:])

    codes._compiled = eager_graph
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(3, model.config.dim, generator=gen)
    code0 = torch.tensor([3, 9, 27])
    sampling = BatchSampling(
        temperature=torch.full((3,), 0.7),
        top_p=torch.full((3,), 1e-6),
        repetition_penalty=torch.tensor([1.0, 1.2, 1.5]),
    )
    windows = torch.randint(0, 50, (3, model.config.num_codebooks + 1, 16), generator=gen)
    noise = frame_noise(model, 3).fast
    with torch.inference_mode():
        got = codes(model, cache, hidden, code0, sampling, windows, noise)
        want = fast_codes(model, cache, hidden, code0, sampling, windows, noise)
    assert seen_batches == [4]
    assert got.shape == (3, model.config.num_codebooks - 1)
    assert torch.equal(got, want)
