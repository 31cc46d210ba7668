"""Slots and batching: a batch at different positions equals each sequence alone (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamtts.models.fish.llm.checkpoint import FishLLM, load_fish_llm
from streamtts.models.fish.llm.generate import (
    RepetitionWindows,
    decode_step,
    generate,
    prefill_frame,
)
from streamtts.models.fish.llm.llama import DualARTransformer
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.sampling import BatchSampling, SamplingParams

ATOL = 1e-5
TEXTS = ["Hello world.", "A somewhat longer sentence, with a comma and more words in it.", "Hi!"]
GREEDY = SamplingParams(temperature=0.7, top_p=1e-4, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def llm(fish_fixture_dir: Path) -> FishLLM:
    return load_fish_llm(fish_fixture_dir, torch.float32)


@pytest.fixture(scope="module")
def prompts(llm: FishLLM) -> list[torch.Tensor]:
    builder = PromptBuilder(llm.tokenizer, llm.config.num_codebooks)
    return [builder.build(t) for t in TEXTS]


def random_frames(model: DualARTransformer, n: int, seed: int) -> torch.Tensor:
    """[n, C+1] semantic frames."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(
        0, model.config.codebook_size, (n, model.config.num_codebooks), generator=gen
    )
    return torch.cat([codes[:, :1] + model.semantic_begin_id, codes], dim=1)


def solo_logits(
    model: DualARTransformer, prompt: torch.Tensor, frames: torch.Tensor
) -> list[torch.Tensor]:
    cache = model.allocate_cache(1)
    out = [model.prefill(cache, prompt, slot=0).logits]
    length = prompt.shape[1]
    for j, frame in enumerate(frames):
        pos = torch.tensor([length + j])
        out.append(
            model.decode_slow(
                cache, frame[None, :, None], torch.tensor([0]), pos, length + j + 1
            ).logits[0]
        )
    return out


@torch.no_grad()
def test_batch_at_different_positions_equals_solo(
    llm: FishLLM, prompts: list[torch.Tensor]
) -> None:
    model = llm.model
    steps = 6
    frames = [random_frames(model, steps, seed) for seed in range(len(prompts))]
    expected = [solo_logits(model, p, f) for p, f in zip(prompts, frames, strict=True)]
    cache = model.allocate_cache(4)
    slot_of = [3, 0, 2]
    start_step = [0, 0, 2]  # the third sequence joins the batch two steps later
    for i, prompt in enumerate(prompts):
        first = model.prefill(cache, prompt, slot=slot_of[i]).logits
        torch.testing.assert_close(first, expected[i][0], atol=ATOL, rtol=0)
    for step in range(steps + 2):
        rows = [i for i in range(len(prompts)) if 0 <= step - start_step[i] < steps]
        js = [step - start_step[i] for i in rows]
        positions = torch.tensor([prompts[i].shape[1] + j for i, j in zip(rows, js, strict=True)])
        tokens = torch.stack([frames[i][j] for i, j in zip(rows, js, strict=True)])[:, :, None]
        slots = torch.tensor([slot_of[i] for i in rows])
        out = model.decode_slow(cache, tokens, slots, positions, int(positions.max()) + 1)
        for b, (i, j) in enumerate(zip(rows, js, strict=True)):
            torch.testing.assert_close(out.logits[b], expected[i][j + 1], atol=ATOL, rtol=0)


@torch.no_grad()
def test_chunked_prefill_and_prefix_reuse(llm: FishLLM, prompts: list[torch.Tensor]) -> None:
    model = llm.model
    prompt = prompts[1]
    whole = model.prefill(model.allocate_cache(1), prompt, slot=0, return_all=True)
    cache = model.allocate_cache(3)
    split = 17
    model.prefill(cache, prompt[:, :split], slot=1)
    tail = model.prefill(cache, prompt[:, split:], slot=1, start_pos=split, return_all=True)
    torch.testing.assert_close(tail.logits, whole.logits[split:], atol=ATOL, rtol=0)
    cache.copy_prefix(src_slot=1, dst_slot=2, length=split)
    reused = model.prefill(cache, prompt[:, split:], slot=2, start_pos=split, return_all=True)
    torch.testing.assert_close(reused.logits, whole.logits[split:], atol=ATOL, rtol=0)


@torch.no_grad()
def test_batched_decode_step_frames_equal_solo_generation(
    llm: FishLLM, prompts: list[torch.Tensor]
) -> None:
    model, im_end = llm.model, llm.tokenizer.im_end_id
    n_frames = 10
    solo = [generate(model, p, im_end, n_frames, GREEDY).frames for p in prompts]
    slots = torch.tensor([2, 0, 1])
    cache = model.allocate_cache(3)
    sampling = BatchSampling.from_params([GREEDY] * len(prompts))
    windows = RepetitionWindows(cache.slots, model.config.num_codebooks + 1)
    frames = torch.stack(
        [
            prefill_frame(model, cache, p, int(s), sampling.select(torch.tensor([b])))
            for b, (p, s) in enumerate(zip(prompts, slots, strict=True))
        ]
    )  # [B, C+1]
    generated = [frames]
    lengths = torch.tensor([p.shape[1] for p in prompts])
    for step in range(n_frames - 1):
        positions = lengths + step
        frames = decode_step(
            model,
            cache,
            frames,
            slots,
            positions,
            int(positions.max()) + 1,
            windows,
            torch.full((len(prompts),), step),
            sampling,
        )
        generated.append(frames)
    batched = torch.stack(generated, dim=2)  # [B, C+1, n]
    for b, expected in enumerate(solo):
        n = expected.shape[1]  # a solo run may stop early on <|im_end|>
        assert torch.equal(batched[b, :, :n], expected)
