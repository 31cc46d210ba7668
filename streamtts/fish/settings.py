"""Settings of the Fish-Speech runtime (no torch here: the server's configuration imports it)."""

from __future__ import annotations

from dataclasses import dataclass

from streamtts.bounds import SettingsError, require_bounds

AUTO = "auto"  # bf16 where the hardware has it, else fp32 (on the CPU with packed weights)
INT8 = "int8"  # int8 weight-only linear layers (CPU), computing in the dtype auto picks
FP32 = "fp32"  # upstream's kernels throughout: the parity mode (nothing packed)
DTYPES = (AUTO, "bf16", "fp16", FP32, INT8)


@dataclass(frozen=True)
class FishSettings:
    # "auto": CUDA if present, else the CPU; bf16 where the hardware has it, else fp32.
    device: str = "auto"
    dtype: str = AUTO
    max_streams: int = 8  # KV-cache slots = concurrent Fish streams
    context_tokens: int = 4096  # per-stream KV length; the iterative prompt's budget
    # Frames before the first audio of a segment (46.4 ms each); 0: 1, or 2 while the engine
    # runs at 0.8-1x real time (ChunkSchedule.auto_first_frames).
    first_chunk_frames: int = 0
    chunk_frames: int = 8  # the most frames per later chunk (ramping up, or early: ChunkSchedule)
    prefill_chunk_tokens: int = 128  # prompt tokens prefilled per step between decode steps
    max_frames_per_segment: int = 1024
    cpu_threads: int = 0  # torch intra-op threads, process-wide (0: one per core)
    max_cached_voices: int = 16  # cloned voices whose prompt prefix is kept (LRU)
    compile: bool = False  # torch.compile the decode step at start (docs/operations.md)
    # The slow step and the codebook pass as C++ ops where their layers are packed (CPU), built
    # at first start, and bf16 layers on the library's AVX512-BF16 kernel where the CPU has it
    # (the slow ones only without AMX); the Python code on oneDNN's layers where they do not
    # apply or cannot be built (docs/operations.md).
    fused_ops: bool = True

    def __post_init__(self) -> None:
        require_bounds(
            self,
            max_streams=1,
            context_tokens=64,
            first_chunk_frames=0,
            chunk_frames=1,
            prefill_chunk_tokens=1,
            max_frames_per_segment=1,
        )
        if self.dtype not in DTYPES:
            raise SettingsError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def parity(self) -> bool:
        """Explicit fp32: upstream's kernels throughout, nothing packed (every other dtype may
        pack what computes in fp32: ``auto`` or ``int8`` on a CPU without native bf16)."""
        return self.dtype == FP32
