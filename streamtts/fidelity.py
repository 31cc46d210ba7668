"""``streamtts bench --fidelity``: how far bf16, int8 and ``auto`` move the model from fp32.

``auto`` is what the engine runs by default here: bf16 where the hardware has it, else fp32
with oneDNN-packed weights (fp32 roundings from the reference, which keeps upstream's kernels).

The reference is the fp32 model. A teacher sequence — a prompt and the frames the fp32 model
generates greedily from it — is run through each precision exactly as the engine runs it
(the same weight preparation: int8 layers, or packed bf16 where the CPU has the kernels; the
serving paths: prefill, slow decode step, codebook pass), teacher-forced, so every precision
sees the same inputs. Per head (the slow token over the vocabulary, and the codebooks):

- ``max_abs`` / ``mean_abs``: logit error against fp32; ``rel_rms``: its RMS over fp32's;
- ``top1``: how often the argmax (what greedy decoding picks) equals fp32's;
- ``top_p_overlap``: the mean Jaccard overlap of the nucleus sets (``top_p`` of the untempered
  softmax, as upstream samples from) with fp32's.

Then ``greedy_agreement``: the share of frames equal to fp32's when each precision generates
greedily on its own (up to the first differing frame, and over all frames).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from streamtts.fish.devices import choose_device, choose_dtype
from streamtts.fish.load import load_fish_bundle, prepare_llm
from streamtts.fish.settings import FishSettings
from streamtts.fish.spec import FishSpec
from streamtts.models.fish.llm.generate import generate
from streamtts.models.fish.llm.llama import DualARTransformer
from streamtts.models.fish.llm.prompt import PromptBuilder
from streamtts.models.fish.llm.sampling import SamplingParams, top_p_filter_by_sorting
from streamtts.models.fish.packed import is_packed

TEXT = "The weather is lovely today, so let us walk down to the sea and watch the boats."
GREEDY = SamplingParams(top_p=1e-4, repetition_penalty=1.0)
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}  # int8 and auto: by the CPU
COMPARED = ("bf16", "int8", "auto")  # auto: what the engine runs by default on this machine


@dataclass(frozen=True)
class FidelityOptions:
    model: str = "synthetic:1.5"
    device: str = "cpu"
    steps: int = 48
    top_p: float = 0.7


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load(spec: FishSpec, precision: str, device: torch.device) -> tuple[DualARTransformer, Any]:
    dtype = PRECISIONS.get(precision) or choose_dtype(precision, device)
    bundle = load_fish_bundle(spec, device, dtype)
    model = bundle.llm.model
    prepare_llm(model, FishSettings(dtype=precision))
    return model, bundle.llm.tokenizer


@torch.inference_mode()
def teacher_forced(
    model: DualARTransformer, prompt: torch.Tensor, frames: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slow logits [N, V] and codebook logits [N, C-1, K] (fp32) of each frame of ``frames``
    [C+1, N] after ``prompt`` [C+1, T], through the serving paths."""
    cache = model.allocate_cache(1, prompt.shape[1] + frames.shape[1] + 1)
    out = model.prefill(cache, prompt, 0)
    logits, hidden = out.logits[None], out.hidden[None]
    slow, fast = [], []
    slot = torch.tensor([0], device=model.device)
    for t in range(frames.shape[1]):
        frame = frames[:, t].to(model.device)
        slow.append(logits[0].float())
        model.fast_step(cache, hidden, 0)
        per_codebook = []
        for k in range(1, model.config.num_codebooks):
            x = model.fast_embeddings(frame[k : k + 1].long())
            per_codebook.append(model.fast_step(cache, x, k)[0].float())
        fast.append(torch.stack(per_codebook))
        position = prompt.shape[1] + t
        step = model.decode_slow(
            cache, frame[None, :, None], slot, torch.tensor([position], device=model.device),
            position + 1,
        )  # fmt: skip
        logits, hidden = step.logits, step.hidden
    return torch.stack(slow), torch.stack(fast)


def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The nucleus of each row [R, V] as a mask (fp32 logits, upstream's cut)."""
    kept = top_p_filter_by_sorting(logits, torch.full((logits.shape[0],), top_p))
    return torch.isfinite(kept)


def compare(reference: torch.Tensor, got: torch.Tensor, top_p: float) -> dict[str, float]:
    """Errors of ``got`` against ``reference`` over rows of logits [..., V]."""
    ref = reference.reshape(-1, reference.shape[-1])
    out = got.reshape(-1, got.shape[-1])
    error = (out - ref).abs()
    a, b = nucleus(ref, top_p), nucleus(out, top_p)
    overlap = (a & b).sum(-1).float() / (a | b).sum(-1).float()
    return {
        "max_abs": round(float(error.max()), 5),
        "mean_abs": round(float(error.mean()), 6),
        "rel_rms": round(float((out - ref).square().mean().sqrt() / ref.square().mean().sqrt()), 6),
        "top1": round(float((out.argmax(-1) == ref.argmax(-1)).float().mean()), 4),
        "top_p_overlap": round(float(overlap.mean()), 4),
    }


def greedy_agreement(frames: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    n = min(frames.shape[1], reference.shape[1])
    same = (frames[:, :n] == reference[:, :n]).all(dim=0)  # [n]
    differ = (~same).nonzero()
    prefix = int(differ[0, 0]) if differ.numel() else n
    return {"prefix": round(prefix / n, 4), "all": round(float(same.float().mean()), 4)}


def run_fidelity(options: FidelityOptions) -> dict[str, Any]:
    spec = FishSpec.parse(options.model)
    if spec is None:
        raise ValueError(f"{options.model!r} is not a Fish model")
    device = choose_device(options.device)
    progress(f"fidelity: {options.model}, {options.steps} frames, fp32 reference ...")
    reference, tokenizer = load(spec, "fp32", device)
    prompt = PromptBuilder(tokenizer, reference.config.num_codebooks).build(TEXT)
    im_end = tokenizer.im_end_id
    with torch.inference_mode():
        teacher = generate(reference, prompt, im_end, options.steps + 1, GREEDY).frames.cpu()
        teacher = teacher[:, : options.steps]
    ref_slow, ref_fast = teacher_forced(reference, prompt, teacher)
    del reference
    result: dict[str, Any] = {
        "model": options.model,
        "frames": int(teacher.shape[1]),
        "top_p": options.top_p,
    }
    for precision in COMPARED:
        progress(f"  {precision} ...")
        model, _ = load(spec, precision, device)
        slow, fast = teacher_forced(model, prompt, teacher)
        with torch.inference_mode():
            own = generate(model, prompt, im_end, options.steps + 1, GREEDY).frames.cpu()
        result[precision] = {
            "dtype": str(model.dtype).removeprefix("torch."),
            "packed": is_packed(model),
            "slow": compare(ref_slow, slow, options.top_p),
            "codebooks": compare(ref_fast, fast, options.top_p),
            "greedy_agreement": greedy_agreement(own[:, : options.steps], teacher),
        }
        del model
    return result
