"""The codebook pass as one C++ op over packed layers (``csrc/codebook_pass.cpp``).

Eager, the pass of a frame (4 layers at 8 positions, then sampling 7 codebooks) is ~1100 small
kernels around 135 matrix products, and Python runs between every two of them: on the 2-core
dev CPU (bf16, AMX, 2026-12-05) the pass took 60-64 ms where its 135 products alone took 37-41.
The op makes the same ATen calls in the same order from C++, so its codes, KV-cache writes and
every result bit are the Python pass's (tested), in 44-49 ms. It applies where the fast layers
are packed for oneDNN (:mod:`streamtts.models.fish.packed`: bf16 on a CPU with native bf16, the
fp32 of ``dtype auto`` on one without) and the codebook is sampled by sorting (K < 8192).

The op is compiled from its source at first use (``torch.utils.cpp_extension``: a C++ compiler
and ninja, about 10-20 s once) into ``<TORCH_EXTENSIONS_DIR>/streamtts_codebook_pass-<key>``
(``$XDG_CACHE_HOME/torch_extensions`` by default), the key naming the source, the flags and torch's
version; a later start, or another process, loads the library from there with no compiler.
Where it cannot be built, :func:`codebook_pass_for` says why and the Python pass runs.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import cpp_extension

from streamtts.models.fish.llm.generate import FastCodes, fast_codes
from streamtts.models.fish.llm.llama import DualARTransformer, KVCache, TransformerBlock
from streamtts.models.fish.llm.sampling import COUNTING_MIN_VOCAB, BatchSampling
from streamtts.models.fish.packed import PackedLinear

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "codebook_pass.cpp"
LIBRARY_NAME = "streamtts_codebook_pass"
# No -march=native: a library built once may be loaded on another x86-64 host (a shared cache
# volume); the op's arithmetic is all in ATen's own kernels anyway.
BUILD_FLAGS = ("-O2",)


class FusedPassUnavailable(RuntimeError):
    """The fused pass does not apply to this model, or its library cannot be built here."""


def library_path() -> Path:
    """Where the library for this source, these flags and this torch is kept."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join(BUILD_FLAGS).encode())
    digest.update(torch.__version__.encode())
    # torch's own convention for extensions (TORCH_EXTENSIONS_DIR, else the user cache).
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root())
    return root / f"{LIBRARY_NAME}-{digest.hexdigest()[:16]}" / f"{LIBRARY_NAME}.so"


@functools.cache
def load_library() -> None:
    """Load the op's library, building it first where none is kept (once per process)."""
    library = library_path()
    if library.exists():
        try:
            torch.ops.load_library(str(library))  # type: ignore[no-untyped-call]
        except OSError as exc:  # e.g. built against another libtorch under the same key
            raise FusedPassUnavailable(f"loading {library} failed: {exc}") from exc
        return
    # Built in a directory of this process's own, then moved into place in one rename: a
    # process starting meanwhile sees the whole library or none.
    build = library.parent / f"build-{os.getpid()}"
    log.info("building the fused codebook pass (once, ~10-20 s) into %s", library.parent)
    started_s = time.perf_counter()
    try:
        build.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(
            name=LIBRARY_NAME,
            sources=[str(SOURCE)],
            extra_cflags=list(BUILD_FLAGS),
            build_directory=str(build),
            is_python_module=False,
            verbose=False,
        )
    except (OSError, RuntimeError, ImportError) as exc:  # no compiler or ninja: a clear reason
        raise FusedPassUnavailable(f"building {SOURCE.name} failed: {exc}") from exc
    os.replace(build / f"{LIBRARY_NAME}.so", library)
    shutil.rmtree(build, ignore_errors=True)
    log.info("built the fused codebook pass in %.1f s", time.perf_counter() - started_s)


def why_not_fused(model: DualARTransformer) -> str | None:
    """Why the fused pass does not apply to ``model`` (None: it does)."""
    if model.device.type != "cpu":
        return f"the model is on {model.device.type}, not the CPU"
    if model.config.codebook_size >= COUNTING_MIN_VOCAB:
        return f"codebooks of {model.config.codebook_size} entries are not sampled by sorting"
    products: list[object] = [model.fast_output]
    for block in model.fast_layers:
        assert isinstance(block, TransformerBlock)
        if block.feed_forward.w13 is None:
            return "the gate and up projections are not fused"
        attention = block.attention
        products += [attention.wqkv, attention.wo, block.feed_forward.w13, block.feed_forward.w2]
    if not all(isinstance(m, PackedLinear) for m in products):
        return "the fast layers are not packed for oneDNN"
    return None


@dataclass(frozen=True)
class _Weights:
    norms: list[torch.Tensor]  # [2L]: attention_norm, ffn_norm per layer
    packed: list[torch.Tensor]  # [4L]: wqkv, wo, w13, w2 per layer
    qkv_bias: list[torch.Tensor | None]  # [L]


def _packed(module: object) -> PackedLinear:
    assert isinstance(module, PackedLinear)
    return module


class FusedCodebookPass:
    """A drop-in for :func:`fast_codes` on one model whose fast layers are packed: the
    ``streamtts_fused::codebook_pass`` op (:func:`load_library` first)."""

    def __init__(self, model: DualARTransformer) -> None:
        if (reason := why_not_fused(model)) is not None:
            raise FusedPassUnavailable(reason)
        self.model = model
        norms: list[torch.Tensor] = []
        packed: list[torch.Tensor] = []
        biases: list[torch.Tensor | None] = []
        for block in model.fast_layers:
            assert isinstance(block, TransformerBlock)
            norms += [block.attention_norm.weight, block.ffn_norm.weight]
            wqkv = _packed(block.attention.wqkv)
            products = (block.attention.wo, block.feed_forward.w13, block.feed_forward.w2)
            packed += [wqkv.packed, *(_packed(m).packed for m in products)]
            biases.append(wqkv.bias)
        self._weights = _Weights(norms, packed, biases)
        self._output = _packed(model.fast_output).packed
        block_config = model.config.fast_block
        self._heads = (block_config.n_head, block_config.n_local_heads, block_config.head_dim)

    def __call__(
        self,
        model: DualARTransformer,
        cache: KVCache,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        sampling: BatchSampling,
        windows: torch.Tensor | None,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        """:func:`fast_codes`: hidden [B, D], code0 [B] → codebooks 1.. [B, C-1] int64."""
        if model is not self.model:
            raise ValueError("this fused pass holds another model's weights")
        n_q, n_kv, dh = self._heads
        codes: torch.Tensor = torch.ops.streamtts_fused.codebook_pass(
            hidden,
            code0.long(),
            self._weights.norms,
            self._weights.packed,
            self._weights.qkv_bias,
            model.fast_norm.weight,
            self._output,
            model.fast_embeddings.weight,
            model.fast_rope,
            cache.fast_k,
            cache.fast_v,
            sampling.temperature,
            sampling.top_p,
            sampling.repetition_penalty,
            windows,
            noise,
            n_q,
            n_kv,
            dh,
            model.fast_norm.eps,
        )
        return codes


FUSED = "fused"
PYTHON = "python"


def codebook_pass_for(model: DualARTransformer, enabled: bool) -> tuple[FastCodes, str]:
    """The codebook pass to run on ``model``: the fused op where it applies and builds (with
    ``enabled``), else :func:`fast_codes`; and what runs, for the engine's description:
    ``"fused"``, or ``"python"`` with the reason."""
    if not enabled:
        return fast_codes, f"{PYTHON} (fused_codebook_pass is off)"
    try:
        fused = FusedCodebookPass(model)
    except FusedPassUnavailable as exc:
        return fast_codes, f"{PYTHON} ({exc})"
    try:
        load_library()
    except FusedPassUnavailable as exc:
        log.warning("the fused codebook pass is unavailable, the Python pass runs: %s", exc)
        return fast_codes, f"{PYTHON} ({exc})"
    return fused, FUSED
