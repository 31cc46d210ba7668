"""Text-to-semantic model parity with upstream (fixture ``llm_*``, ``fast_*``, ``gen_*`` entries).

Every entry is interpreted from its file name and ``index.json`` metadata; shapes, ids and
sampling settings come from the fixture, so further fixture sets of this format need no code.

Tolerances: fp32 1e-4 max abs (measured ≤ 1.5e-7). bf16: measured bit-identical on the reference
CPU; asserted within :data:`BF16_REL_TOL` × max(1, max |expected|) (one bf16 ulp at the top of
the range), so a CPU with other bf16 kernels can still pass while a real bug fails.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from streamtts.models.fish.llm.checkpoint import FishLLM, load_fish_llm
from streamtts.models.fish.llm.generate import generate
from streamtts.models.fish.llm.llama import DualARTransformer
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.sampling import SamplingParams
from tests.fish_fixture import Index, entries, generation_call, meta, read, sibling

FP32_ATOL = 1e-4
BF16_REL_TOL = 2.0**-7  # one bf16 ulp for magnitudes in [1, 2)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LLM_INPUT_FILE = "llm_input.npy"
FAST_HIDDEN_FILE = "fast_hidden_in.npy"
FAST_CODES_FILE = "fast_codes_in.npy"

_models: dict[tuple[Path, str], FishLLM] = {}


def model_for(directory: Path, precision: str) -> FishLLM:
    key = (directory, precision)
    if key not in _models:
        _models[key] = load_fish_llm(directory, DTYPES[precision])
    return _models[key]


def precision_of(entry: str) -> str:
    found = [p for p in DTYPES if f"_{p}" in entry]
    assert len(found) == 1, f"cannot tell the precision of {entry}"
    return found[0]


def assert_close(got: torch.Tensor, expected: np.ndarray, precision: str) -> None:
    got_np = got.detach().float().numpy()
    assert got_np.shape == expected.shape
    diff = float(np.abs(got_np - expected).max())
    if precision == "fp32":
        assert diff <= FP32_ATOL, f"max abs diff {diff}"
    else:
        bound = BF16_REL_TOL * max(1.0, float(np.abs(expected).max()))
        assert diff <= bound, f"max abs diff {diff} > {bound}"


# ---- teacher-forced forward passes ---------------------------------------------------------

_FWD = re.compile(r"llm_fwd_(train|gen|step)_(fp32|bf16)_(logits|hidden|codebook_logits)\.npy")


@pytest.mark.parametrize("entry", entries(r"llm_fwd_\w+\.npy"))
def test_forward_matches_upstream(entry: str, fish_fixture_dir: Path) -> None:
    match = _FWD.fullmatch(entry)
    assert match, f"unknown llm_fwd entry {entry}"
    mode, precision, output = match.groups()
    model = model_for(fish_fixture_dir, precision).model
    tokens = torch.from_numpy(read(fish_fixture_dir, LLM_INPUT_FILE))  # [1, C+1, T]
    with torch.no_grad():
        if mode == "train":
            result = model.forward_train(tokens)
            got = {"logits": result.logits, "hidden": result.hidden}.get(output)
            got = result.codebook_logits[0] if got is None else got[0]
        elif mode == "gen":
            cache = model.allocate_cache(2)
            slow = model.prefill(cache, tokens[0], slot=1, return_all=True)
            got = slow.logits if output == "logits" else slow.hidden
        else:
            # Upstream's decode attention kernel; the CPU default is checked below.
            got = decode_one_at_a_time(model, tokens, output, kernel="sdpa")
    expected = read(fish_fixture_dir, entry)
    if output == "codebook_logits":
        skipped = (expected == 0).all(axis=(1, 2))
        np.testing.assert_array_equal((got == 0).all(dim=2).all(dim=1).numpy(), skipped)
    assert_close(got, expected, precision)


@pytest.mark.parametrize("entry", entries(r"fast_logits_\w+\.npy"))
def test_fast_transformer_matches_upstream(entry: str, fish_fixture_dir: Path) -> None:
    precision = precision_of(entry)
    model = model_for(fish_fixture_dir, precision).model
    hidden = torch.from_numpy(read(fish_fixture_dir, FAST_HIDDEN_FILE))  # [N, D]
    codes = torch.from_numpy(read(fish_fixture_dir, FAST_CODES_FILE))  # [N, C-1]
    cache = model.allocate_cache(hidden.shape[0])
    with torch.no_grad():
        pos0 = model.fast_step(cache, hidden.to(model.dtype), 0)  # [N, K]
        later = [
            model.fast_step(cache, model.fast_embeddings(codes[:, k - 1]), k)
            for k in range(1, codes.shape[1] + 1)
        ]
    got = pos0 if "_pos0_" in entry else torch.stack(later, dim=1)
    assert_close(got, read(fish_fixture_dir, entry), precision)


# ---- seeded generation ---------------------------------------------------------------------

_GEN = re.compile(r"gen_(\w+?)_(fp32|bf16)_y\.npy")


def run_generation(directory: Path, index: Index, entry: str) -> tuple[np.ndarray, Any]:
    precision = _GEN.fullmatch(entry).group(2)  # type: ignore[union-attr]
    llm = model_for(directory, precision)
    call = generation_call(index, entry)
    params = SamplingParams(call["temperature"], call["top_p"], call["repetition_penalty"])
    prompt = PromptBuilder(llm.tokenizer, llm.config.num_codebooks).build(call["text"])
    torch.manual_seed(call["seed"])
    with torch.no_grad():
        result = generate(
            llm.model, prompt, llm.tokenizer.im_end_id, call["max_new_tokens"], params
        )
    return result.tokens.numpy(), result


def first_tie_step(margins: np.ndarray) -> int:
    """Index of the first generated frame with an exact tie in any sample() call (or N)."""
    ties = np.flatnonzero((margins == 0).any(axis=1))
    return int(ties[0]) if ties.size else margins.shape[0]


@pytest.mark.parametrize("entry", entries(_GEN.pattern))
def test_generation_matches_upstream(entry: str, fish_fixture_dir: Path, fish_index: Index) -> None:
    info = meta(fish_index, entry)
    expected = read(fish_fixture_dir, entry)
    got, result = run_generation(fish_fixture_dir, fish_index, entry)
    prompt_len = info["prompt_len"]
    assert result.prompt_len == prompt_len
    np.testing.assert_array_equal(got[:, :prompt_len], expected[:, :prompt_len])
    frames, codes, margins = (
        sibling(entry, "y", kind) for kind in ("frames", "codes", "step_margins")
    )
    if precision_of(entry) == "fp32":
        np.testing.assert_array_equal(got, expected)
        assert result.stopped == info["stopped_on_im_end"]
        np.testing.assert_array_equal(result.frames.numpy(), read(fish_fixture_dir, frames))
        np.testing.assert_array_equal(result.codes.numpy(), read(fish_fixture_dir, codes))
    else:
        # bf16 has exact ties (margin 0) that any 1-ulp difference may resolve differently:
        # frames must agree exactly up to the first tie; later frames are not compared.
        n_exact = first_tie_step(read(fish_fixture_dir, margins))
        end = prompt_len + n_exact
        assert got.shape[1] >= end
        np.testing.assert_array_equal(got[:, :end], expected[:, :end])


_STEP = re.compile(r"gen_(\w+?)_(fp32|bf16)_step_(slow|fast)_logits\.npy")


@pytest.mark.parametrize("entry", entries(_STEP.pattern))
def test_generation_step_logits_match_upstream(
    entry: str, fish_fixture_dir: Path, fish_index: Index
) -> None:
    """Teacher-force the upstream frames and compare the raw slow / fast logits of every step."""
    lang, precision, head = _STEP.fullmatch(entry).groups()  # type: ignore[union-attr]
    y_entry = f"gen_{lang}_{precision}_y.npy"
    prompt_len = meta(fish_index, y_entry)["prompt_len"]
    y = torch.from_numpy(read(fish_fixture_dir, y_entry))  # [C+1, T+N]
    model = model_for(fish_fixture_dir, precision).model
    cache = model.allocate_cache(1)
    slot = torch.tensor([0])
    slow_logits, fast_logits = [], []
    with torch.no_grad():
        out = model.prefill(cache, y[:, :prompt_len], slot=0)
        logits, hidden = out.logits[None], out.hidden[None]
        for t in range(prompt_len, y.shape[1]):
            slow_logits.append(logits[0])
            frame = y[:, t]  # the frame upstream generated from these logits
            model.fast_step(cache, hidden, 0)
            per_codebook = []
            for k in range(1, model.config.num_codebooks):
                x = model.fast_embeddings(frame[k : k + 1].long())
                per_codebook.append(model.fast_step(cache, x, k)[0])
            fast_logits.append(torch.stack(per_codebook))
            step = model.decode_slow(cache, frame[None, :, None], slot, torch.tensor([t]), t + 1)
            logits, hidden = step.logits, step.hidden
    got = torch.stack(slow_logits if head == "slow" else fast_logits)
    assert_close(got, read(fish_fixture_dir, entry), precision)


def decode_one_at_a_time(
    model: DualARTransformer, tokens: torch.Tensor, output: str, kernel: str
) -> torch.Tensor:
    """Decode ``tokens`` [1, C+1, T] one position per step with the given attention kernel."""
    default = model.decode_kernel
    model.decode_kernel = kernel
    try:
        cache = model.allocate_cache(1)
        steps = []
        slot = torch.tensor([0])
        with torch.no_grad():
            for t in range(tokens.shape[-1]):
                out = model.decode_slow(
                    cache, tokens[:, :, t : t + 1], slot, torch.tensor([t]), t + 1
                )
                steps.append(out.logits[0] if output == "logits" else out.hidden[0])
        return torch.stack(steps)
    finally:
        model.decode_kernel = default


@pytest.mark.parametrize("output", ["logits", "hidden"])
def test_cpu_decode_kernel_is_as_accurate_as_upstream_bf16(
    output: str, fish_fixture_dir: Path
) -> None:
    """The fp32 decode attention (the CPU default) rounds differently from upstream's fused
    kernel (up to two bf16 steps apart after 40 positions), so it is held to the fp32 truth
    instead: its error must be no larger than upstream's own bf16 error, max and mean."""
    model = model_for(fish_fixture_dir, "bf16").model
    tokens = torch.from_numpy(read(fish_fixture_dir, LLM_INPUT_FILE))
    got = decode_one_at_a_time(model, tokens, output, kernel="fp32").float().numpy()
    truth = read(fish_fixture_dir, f"llm_fwd_step_fp32_{output}.npy")
    upstream = read(fish_fixture_dir, f"llm_fwd_step_bf16_{output}.npy")
    ours_error, upstream_error = np.abs(got - truth), np.abs(upstream - truth)
    assert ours_error.max() <= 1.1 * upstream_error.max()
    assert ours_error.mean() <= 1.1 * upstream_error.mean()
