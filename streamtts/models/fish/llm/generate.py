"""Frame generation for Fish-Speech 1.5 (spec §4.3–4.4), built on batched primitives.

* :func:`sample_frame` turns slow logits/hidden states ``[B, ...]`` into one frame per row:
  the slow token, then codebook 0 derived from it, then codebooks 1..C-1 from the fast
  transformer, each sampled with the row's own parameters.
* :func:`prefill_frame` prefills one prompt into a slot and samples its first frame (no
  repetition penalty, as upstream).
* :func:`decode_step` is the reusable batched step: previous frames of B sequences in B slots at
  B different positions → the next frame of each, recorded in the repetition windows. No host
  synchronisation inside.
* :class:`RepetitionWindows` keeps upstream's 16-frame penalty window per slot.
* :class:`FrameNoise` holds one frame's random draws, made before the frame is computed
  (:func:`frame_noise`), so compiled passes hold no random number generator and a seeded
  sequence draws from its own generator.
* :func:`generate` is the single-sequence reference loop matching upstream ``generate()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from streamtts.models.fish.llm.llama import DualARTransformer, KVCache, SlowOutput
from streamtts.models.fish.llm.sampling import (
    BatchSampling,
    Generators,
    SamplingParams,
    draw_noise,
    sample,
)

# Frames in the repetition-penalty window (zero-initialised, upstream).
WINDOW_FRAMES = 16


FastCodes = Callable[..., torch.Tensor]
# (model, cache, tokens [B, C+1, 1], slots [B], positions [B], kv_len) -> SlowOutput
SlowStep = Callable[
    [DualARTransformer, KVCache, torch.Tensor, torch.Tensor, torch.Tensor, int], SlowOutput
]
# The slow transformer's decode step as a plain function of the model, which can be compiled.
slow_step: SlowStep = DualARTransformer.decode_slow
# (model, cache, prompt [C+1, S], slot, start_pos) -> SlowOutput of the last position
Prefill = Callable[[DualARTransformer, KVCache, torch.Tensor, int, int], SlowOutput]
slow_prefill: Prefill = DualARTransformer.prefill


@dataclass(frozen=True)
class FrameNoise:
    """``Exponential(1)`` draws for one frame per row, in the model dtype."""

    slow: torch.Tensor  # [B, V]: the slow token
    fast: torch.Tensor  # [B, C-1, K]: codebooks 1..C-1

    def select(self, rows: torch.Tensor) -> FrameNoise:
        return FrameNoise(self.slow.index_select(0, rows), self.fast.index_select(0, rows))


def frame_noise(
    model: DualARTransformer,
    batch: int,
    generators: Generators = (),
    upstream_draws: bool = True,
) -> FrameNoise:
    """One frame's draws for ``batch`` rows; row i from ``generators[i]`` if it has one.

    In upstream's order: the slow token's draw of size V, then one of size K per codebook, so
    a row with its own generator (or, with ``upstream_draws``, batch 1 on the default one) draws
    what upstream draws. Without ``upstream_draws``, rows on the default generator draw faster
    (:func:`draw_noise`).
    """
    cfg = model.config
    dtype, device = model.dtype, model.device
    slow = torch.empty(batch, cfg.vocab_size, dtype=dtype, device=device)  # [B, V]
    draw_noise(slow, generators, upstream_draws)
    fast = torch.empty(batch, cfg.num_codebooks - 1, cfg.codebook_size, dtype=dtype, device=device)
    for k in range(cfg.num_codebooks - 1):
        draw_noise(fast[:, k], generators, upstream_draws)  # [B, K]
    return FrameNoise(slow, fast)


def fast_codes(
    model: DualARTransformer,
    cache: KVCache,
    hidden: torch.Tensor,
    code0: torch.Tensor,
    sampling: BatchSampling,
    windows: torch.Tensor | None,
    noise: torch.Tensor,
) -> torch.Tensor:
    """Codebooks 1.. of a frame from the fast transformer: hidden [B, D], code0 [B] → [B, C-1].

    Position 0 takes the slow hidden state (its logits are unused upstream); position k the
    embedding of codebook k-1. Window row k+1 penalises codebook k; ``noise`` [B, C-1, K] holds
    the codebooks' random draws. Shapes depend on B only, so the pass compiles per batch size.
    """
    model.fast_step(cache, hidden, 0, logits=False)
    code = code0
    codes = []
    for k in range(1, model.config.num_codebooks):
        fast_logits = model.fast_step(cache, model.fast_embeddings(code), k)  # [B, K]
        window = None if windows is None else windows[:, k + 1]
        code = sample(fast_logits, sampling, window, noise[:, k - 1])  # [B]
        codes.append(code)
    return torch.stack(codes, dim=1)  # [B, C-1]


def sample_frame(
    model: DualARTransformer,
    cache: KVCache,
    logits: torch.Tensor,
    hidden: torch.Tensor,
    sampling: BatchSampling,
    windows: torch.Tensor | None,
    noise: FrameNoise,
    fast: FastCodes = fast_codes,
) -> torch.Tensor:
    """Sample one frame per row: logits [B, V], hidden [B, D], windows [B, C+1, W] → [B, C+1] int32.

    Row 0 of the frame is the slow token (sampled over the whole vocabulary); codebook 0 is that
    token minus ``<|semantic:0|>``, clamped into the codebook; codebooks 1.. come from the fast
    transformer (``fast``: :func:`fast_codes` or a compiled equivalent). Window row 0 penalises
    slow tokens, row k+1 codebook k (row 1 is unused).
    """
    cfg = model.config
    slow_window = None if windows is None else windows[:, 0]
    slow_token = sample(logits, sampling, slow_window, noise.slow)  # [B]
    code0 = (slow_token - model.semantic_begin_id).clamp(0, cfg.codebook_size - 1)  # [B]
    rest = fast(model, cache, hidden, code0, sampling, windows, noise.fast)  # [B, C-1]
    frame = torch.cat([slow_token[:, None], code0[:, None], rest], dim=1)  # [B, C+1]
    return frame.to(torch.int32)


def prefill_frame(
    model: DualARTransformer,
    cache: KVCache,
    prompt: torch.Tensor,
    slot: int,
    sampling: BatchSampling,
    start_pos: int = 0,
    generator: torch.Generator | None = None,
    upstream_draws: bool = True,
    fast: FastCodes = fast_codes,
    prefill: Prefill = slow_prefill,
) -> torch.Tensor:
    """Prefill ``prompt`` [C+1, S] into ``slot`` from ``start_pos``; sample its first frame [C+1].

    ``sampling`` holds one row; ``generator``: the sequence's own (``None``: the default one,
    drawn from as ``upstream_draws`` says: :func:`frame_noise`). ``fast`` runs the frame's
    codebook pass, as in :func:`decode_step`, and ``prefill`` the slow transformer over the
    prompt (:meth:`DualARTransformer.prefill`, or the fused op). For a chunked prefill, call
    ``prefill`` for the earlier chunks and this for the last one.
    """
    out = prefill(model, cache, prompt, slot, start_pos)
    noise = frame_noise(model, 1, [generator], upstream_draws)
    logits, hidden = out.logits[None], out.hidden[None]  # [1, V], [1, D]
    return sample_frame(model, cache, logits, hidden, sampling, None, noise, fast)[0]


def decode_step(
    model: DualARTransformer,
    cache: KVCache,
    frames: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    kv_len: int,
    windows: RepetitionWindows,
    steps: torch.Tensor,
    sampling: BatchSampling,
    generators: Generators = (),
    fast: FastCodes = fast_codes,
    slow: SlowStep = slow_step,
    upstream_draws: bool = True,
) -> torch.Tensor:
    """One decode step for B sequences: previous frames [B, C+1] → next frames [B, C+1] int32.

    slots [B] int64 (distinct), positions [B] int64 (position of each input frame),
    ``kv_len`` a host-side bound > max(positions), sampling with B rows, ``generators`` each
    row's own (or ``None``: the default one, drawn from as ``upstream_draws`` says:
    :func:`frame_noise`). The slots' repetition windows are read, and the
    new frames recorded at loop step ``steps`` [B] (0 = the first frame after the prefill
    frame). B must not exceed ``cache.slots``. ``fast`` and ``slow`` run the two transformers
    (eager, or compiled equivalents).
    """
    noise = frame_noise(model, frames.shape[0], generators, upstream_draws)
    out = slow(model, cache, frames[:, :, None], slots, positions, kv_len)
    window = windows.gather(slots)  # [B, C+1, W]
    new = sample_frame(model, cache, out.logits, out.hidden, sampling, window, noise, fast)
    windows.push(slots, steps, new)
    return new


class RepetitionWindows:
    """Per-slot ring buffers ``[slots, C+1, 16]`` reproducing upstream's penalty window.

    Upstream's window at loop step i is ``prev[:, :16]`` (zero-padded) for i < 16, else the last
    16 frames. The penalty treats a window as a set, so a ring written at ``i % 16`` is exact.
    """

    def __init__(self, slots: int, rows: int, device: torch.device | str = "cpu") -> None:
        self.buffer = torch.zeros(slots, rows, WINDOW_FRAMES, dtype=torch.int64, device=device)

    def reset(self, slot: int) -> None:
        self.buffer[slot].zero_()

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """Windows of a batch: slots [B] → [B, C+1, 16]."""
        return self.buffer.index_select(0, slots)

    def push(self, slots: torch.Tensor, steps: torch.Tensor, frames: torch.Tensor) -> None:
        """Record loop step ``steps`` [B] (0 = first frame after the prefill frame) of each slot."""
        self.buffer[slots, :, steps % WINDOW_FRAMES] = frames.long()  # [B, C+1]


@dataclass(frozen=True)
class GenerationResult:
    """Upstream's ``y``: prompt followed by the generated frames."""

    tokens: torch.Tensor  # [C+1, T+N] int32
    prompt_len: int
    stopped: bool  # ended by emitting <|im_end|>

    @property
    def frames(self) -> torch.Tensor:
        """[C+1, N]: prefill frame through the last one (the history entry)."""
        return self.tokens[:, self.prompt_len :]

    @property
    def codes(self) -> torch.Tensor:
        """[C, N-1]: what upstream hands to the vocoder (drops the prefill frame)."""
        return self.tokens[1:, self.prompt_len + 1 :]


def generate(
    model: DualARTransformer,
    prompt: torch.Tensor,
    im_end_id: int,
    max_new_tokens: int = 0,
    params: SamplingParams | None = None,
    cache: KVCache | None = None,
    slot: int = 0,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Generate frames for ``prompt`` [C+1, T] until ``<|im_end|>`` or ``max_new_tokens`` frames.

    ``max_new_tokens`` <= 0 or past the cache means "up to the end of the cache" (upstream).
    """
    prompt_len = prompt.shape[1]
    cache = model.allocate_cache(1) if cache is None else cache
    if max_new_tokens <= 0 or prompt_len + max_new_tokens > cache.max_seq_len:
        max_new_tokens = cache.max_seq_len - prompt_len
    sampling = BatchSampling.from_params([params or SamplingParams()], model.device)
    frame = prefill_frame(model, cache, prompt.to(model.device), slot, sampling, 0, generator)
    generated = [frame]
    slots = torch.tensor([slot], device=model.device)
    windows = RepetitionWindows(cache.slots, prompt.shape[0], model.device)
    stopped = False
    for step in range(max_new_tokens - 1):
        position = prompt_len + step
        frame = decode_step(
            model,
            cache,
            frame[None],
            slots,
            torch.tensor([position], device=model.device),
            position + 1,
            windows,
            torch.tensor([step], device=model.device),
            sampling,
            [generator],
        )[0]
        generated.append(frame)
        if int(frame[0]) == im_end_id:
            stopped = True
            break
    tokens = torch.cat([prompt.to(torch.int32), torch.stack(generated, dim=1).cpu()], dim=1)
    return GenerationResult(tokens, prompt_len, stopped)
