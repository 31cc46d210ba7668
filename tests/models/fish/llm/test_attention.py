"""The fp32 decode attention against torch's fused kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from streamtts.models.fish.llm.llama import attention_bias, decode_attention
from streamtts.models.fish.llm.synthetic import load_synthetic


@pytest.mark.parametrize("keys", [7, 320, 2048])
def test_decode_attention_is_the_exact_attention_rounded_once(keys: int) -> None:
    gen = torch.Generator().manual_seed(keys)
    q = torch.randn(3, 16, 1, 64, generator=gen).bfloat16()
    k = torch.randn(3, 2, keys, 64, generator=gen).bfloat16()
    v = torch.randn(3, 2, keys, 64, generator=gen).bfloat16()
    positions = torch.tensor([0, keys // 2, keys - 1])  # each row sees its own prefix
    mask = (torch.arange(keys)[None, :] <= positions[:, None])[:, None, None, :]  # [B,1,1,L]
    got = decode_attention(q, k, v, attention_bias(mask, torch.float32))
    assert got.dtype == torch.bfloat16 and got.shape == (3, 16, 1, 64)
    exact = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask, enable_gqa=True
    )
    # Rounded once: within half a bf16 step of each exact value (plus fp32 accumulation noise).
    assert bool(((got.double() - exact).abs() <= 2.0**-8 * exact.abs() + 1e-5).all())
    assert torch.equal(got[0], v[0, :, :1].repeat_interleave(8, dim=0))  # one key: its value
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    step = 2.0**-7 * fused.float().abs().amax(dim=-1, keepdim=True).clamp(min=1)
    assert bool(((got.float() - fused.float()).abs() <= step).all())


@pytest.mark.parametrize(("dtype", "expected"), [(torch.bfloat16, "fp32"), (torch.float32, "sdpa")])
@torch.inference_mode()
def test_auto_kernel_is_fp32_for_16_bit_models_on_the_cpu(
    dtype: torch.dtype, expected: str
) -> None:
    model = load_synthetic("tiny", dtype, "cpu", seed=2).model
    prompt = torch.randint(0, 500, (9, 30), generator=torch.Generator().manual_seed(4))

    def decode(kernel: str) -> torch.Tensor:
        model.decode_kernel = kernel
        cache = model.allocate_cache(1, 128)
        model.prefill(cache, prompt, 0)
        frames = torch.zeros(1, 9, 1, dtype=torch.int32)
        return model.decode_slow(cache, frames, torch.tensor([0]), torch.tensor([30]), 31).logits

    assert torch.equal(decode("auto"), decode(expected))
    assert not torch.equal(decode("sdpa"), decode("fp32")) or dtype == torch.float32
