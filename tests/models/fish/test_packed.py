"""Packed oneDNN linear layers: the same bits as ``F.linear`` (bf16), fp32 roundings from it
(fp32, under ``dtype auto`` only), fewer bytes moved."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from streamtts.fish.devices import emulation_warning
from streamtts.fish.load import prepare_llm
from streamtts.fish.settings import FishSettings
from streamtts.models.fish.llm.generate import RepetitionWindows, decode_step
from streamtts.models.fish.llm.llama import DualARTransformer, FeedForward, fuse_gate_up_
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams
from streamtts.models.fish.llm.synthetic import load_synthetic
from streamtts.models.fish.packed import PackedLinear, can_pack, is_packed, pack_linears_
from tests.models.fish.bf16 import bf16_step

needs_bf16_onednn = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN has no bf16 kernels here"
)


def assert_same_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit where the CPU has native bf16, for the rows of a decode step. Two kernels
    sum a packed weight in another order than a plain one: oneDNN's for a few rows where it
    emulates bf16 (AVX-512 without BF16; seen on an AVX-512 Xeon: one output in 1000-4000 a
    bf16 step apart), and its AMX kernel for many rows (a prompt's; seen on a Xeon with AMX:
    37 of 384000 outputs of 300 rows, 1280x1024, a step apart, or where a sum cancels to near
    zero, its fp32 roundings: 6e-8 apart). No more than that."""
    rows = got.numel() // got.shape[-1]
    native = emulation_warning(torch.bfloat16, torch.device("cpu")) is None
    if native and (rows <= 16 or not torch.cpu._is_amx_tile_supported()):
        assert torch.equal(got, want)
        return
    apart = got.float() != want.float()
    assert int(apart.sum()) <= max(1, want.numel() // 500)
    if native:  # AMX, many rows: a step of the larger value, or fp32 roundings near zero
        larger = torch.maximum(got.float().abs(), want.float().abs())[apart]
        step = bf16_step(larger).clamp(min=float(want.float().abs().max()) * 2.0**-16)
    else:
        step = want.float().abs()[apart] * 2.0**-7  # a bf16 step at most, for values of this size
    assert bool(((got.float() - want.float()).abs()[apart] <= step).all())


@needs_bf16_onednn
@pytest.mark.parametrize("shape", [(160, 64), (1280, 1024), (1024, 4096)])
def test_packed_linear_equals_f_linear_for_any_row_count(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(shape[0])
    weight = (torch.randn(*shape, generator=gen) * 0.02).bfloat16()
    layer = PackedLinear(weight)
    assert (layer.out_features, layer.in_features) == shape
    assert layer.weight_bytes == weight.numel() * 2
    for rows in (1, 3, 16, 300):
        x = torch.randn(rows, shape[1], generator=gen).bfloat16()
        assert_same_bf16(layer(x), F.linear(x, weight))
    x3 = torch.randn(2, 5, shape[1], generator=gen).bfloat16()
    assert_same_bf16(layer(x3), F.linear(x3, weight))
    bias = torch.randn(shape[0], generator=gen).bfloat16()
    with_bias = PackedLinear(weight, bias)
    assert_same_bf16(with_bias(x3), F.linear(x3, weight, bias))


def test_fused_gate_up_gives_the_same_bits() -> None:
    model = load_synthetic("tiny", torch.bfloat16, "cpu", seed=3).model
    ffn = model.layers[0].feed_forward
    assert isinstance(ffn, FeedForward)
    x = torch.randn(4, 64).bfloat16()
    before = ffn(x)
    ffn.fuse_gate_up()
    assert not hasattr(ffn, "w1") and ffn.w13 is not None
    assert torch.equal(ffn(x), before)


@needs_bf16_onednn
@torch.inference_mode()
def test_packed_model_decodes_bit_identically() -> None:
    plain = load_synthetic("tiny", torch.bfloat16, "cpu", seed=5).model
    packed = load_synthetic("tiny", torch.bfloat16, "cpu", seed=5).model
    assert can_pack(packed)
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed.modules())
    ffns = sum(isinstance(m, FeedForward) for m in packed.modules())
    fuse_gate_up_(packed)
    assert pack_linears_(packed) == linears - ffns  # w1 + w3 became one layer each
    assert is_packed(packed) and not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    prompt = torch.randint(0, 500, (9, 40))
    outputs = [prefill_and_step(model, prompt) for model in (plain, packed)]
    for a, b in zip(*outputs, strict=True):
        assert torch.equal(a, b)


def prefill_and_step(model: DualARTransformer, prompt: torch.Tensor) -> list[torch.Tensor]:
    """Prefill logits and hidden state, one greedy decode step's frame and the slow keys."""
    cache = model.allocate_cache(2, 128)
    prefill = model.prefill(cache, prompt, 1, 0)
    frames = torch.zeros(1, 9, dtype=torch.int32)
    frames[0, 0] = model.semantic_begin_id + 3
    windows = RepetitionWindows(2, 9)
    sampling = BatchSampling.from_params([SamplingParams(top_p=1e-4)])
    step = decode_step(
        model,
        cache,
        frames,
        torch.tensor([1]),
        torch.tensor([40]),
        41,
        windows,
        torch.tensor([0]),
        sampling,
    )
    return [prefill.logits, prefill.hidden, step, cache.k.clone()]


@torch.inference_mode()
def test_auto_packs_fp32_and_explicit_fp32_stays_on_upstreams_kernels() -> None:
    """``dtype auto`` on a CPU without native bf16 is fp32 with packed weights: fp32 roundings
    from the parity mode (explicit ``fp32``, left as loaded), the same greedy frame."""
    prompt = torch.randint(0, 500, (9, 40))
    models = {}
    for setting in ("fp32", "auto"):
        models[setting] = load_synthetic("tiny", torch.float32, "cpu", seed=5).model
        prepare_llm(models[setting], FishSettings(dtype=setting))
    assert not is_packed(models["fp32"]) and is_packed(models["auto"])
    calls: list[str] = []  # the packed layers really ran (their bits may match upstream's)
    for module in models["auto"].modules():
        if isinstance(module, PackedLinear):
            module.register_forward_hook(lambda m, args, out: calls.append(type(m).__name__))
    plain, packed = (prefill_and_step(models[s], prompt) for s in ("fp32", "auto"))
    assert calls, "no packed layer ran"
    logits, hidden, frame, keys = plain
    packed_logits, packed_hidden, packed_frame, packed_keys = packed
    for a, b in ((logits, packed_logits), (hidden, packed_hidden), (keys, packed_keys)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert torch.equal(frame, packed_frame)


def test_only_bf16_cpu_models_pack() -> None:
    fp32_model = load_synthetic("tiny", torch.float32, "cpu", seed=1).model
    assert not can_pack(fp32_model)
    assert can_pack(fp32_model, fp32=True)  # what ``dtype auto`` asks where bf16 is emulated
