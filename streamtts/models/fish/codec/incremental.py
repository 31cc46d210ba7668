"""Exact incremental (streaming) Firefly decoding, batched across streams.

Every decode layer is causal (spec §5.7), so a stream decoded chunk by chunk equals the stream
decoded at once as long as each causal layer sees the same left context. Rather than re-decoding
15 frames of left context per chunk, each stream keeps a :class:`DecoderState`: the last
``W`` input columns of each causal layer (``K - 1`` for convs, one input column for k=2s
transposed convs, six for the ConvNeXt depthwise convs). A chunk then costs only its own frames.

Usage from the engine's vocoder thread::

    dec = IncrementalDecoder(firefly.decoder, device, torch.bfloat16)
    state = dec.new_state()                       # one per utterance stream
    pcm = dec.decode([state_a, state_b], [codes_a, codes_b])   # codes: [8, n_i] each
    # pcm[i]: float32 [n_i * 2048] at 44.1 kHz -- only the new samples, final, no overlap.

Streams in one call may have different histories and different chunk sizes. The object holds no
per-call mutable state, so calls with disjoint states may run concurrently.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from streamtts.models.fish.codec.blocks import CausalConv1d, CausalConvTranspose1d
from streamtts.models.fish.codec.conv_state import LeftContext
from streamtts.models.fish.codec.decoder import FireflyDecoder
from streamtts.models.fish.codec.fsq import out_of_range_codes_total
from streamtts.models.fish.packed import PackedLinear, packs, packs_fp32
from streamtts.models.fish.swap import replace_linears_

__all__ = ["DecoderState", "IncrementalDecoder", "out_of_range_codes_total"]


@dataclass
class DecoderState:
    """One stream's decoder memory. ``context[i]``: [C_i, W_i], the cached columns of slot i."""

    context: list[Tensor]
    frames_decoded: int = 0


class IncrementalDecoder:
    """Decodes code chunks of many streams in one batched forward.

    ``dtype``: compute dtype. With ``autocast=False`` the decoder weights are cast to it (a copy
    is made if the given decoder has another device or dtype); with ``autocast=True`` weights stay
    fp32 and the forward runs under ``torch.autocast(dtype)`` (upstream's engine behaviour).
    Output is always float32. With ``pack``, a bf16 copy on a CPU with oneDNN bf16 kernels
    packs its layers (see :mod:`streamtts.models.fish.codec.blocks`; 6.1 -> 4.5 ms per frame in
    8-frame chunks on the dev CPU), and with ``pack_fp32`` an fp32 one on a CPU with oneDNN
    does too (a Zen 3 without native bf16: real-time factor 0.51 -> 0.39, the audio within
    1.2e-7 of the unpacked decoder's; for ``dtype auto`` and ``int8``, not the parity mode).
    With ``in_place`` the given decoder is cast and packed itself instead of a copy of it (the
    engine's own, just loaded: no second copy in memory at load). With ``row_convs`` (the fused
    ops' library loaded, a CPU with AVX512-BF16) a packed bf16 decoder's fitting convolutions
    run ``streamtts_fused::row_conv`` instead of oneDNN's kernel (see
    :mod:`streamtts.models.fish.codec.blocks`); :attr:`row_convs` counts them.
    """

    def __init__(
        self,
        decoder: FireflyDecoder,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        *,
        autocast: bool = False,
        pack: bool = True,
        pack_fp32: bool = False,
        in_place: bool = False,
        row_convs: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.autocast = autocast and dtype != torch.float32
        weight_dtype = torch.float32 if self.autocast else dtype
        first = next(decoder.parameters())
        self.packed = (
            pack
            and not self.autocast
            and (
                packs(self.device, weight_dtype)
                or (pack_fp32 and packs_fp32(self.device, weight_dtype))
            )
        )
        if first.device != self.device or first.dtype != weight_dtype or self.packed:
            # Casting and packing change modules in place: the caller's only if it gives it
            # (``in_place``; the copy made load peak at 4.43 instead of 4.37 GB, fp32 1.5).
            if not in_place:
                decoder = copy.deepcopy(decoder)
            decoder = decoder.to(self.device, weight_dtype)
        self.decoder = decoder.eval().requires_grad_(False)
        self.row_convs = 0
        if self.packed:
            self.row_convs = _pack_(self.decoder, row_convs)
        self._state_dtype = weight_dtype
        cfg = decoder.config
        self.sample_rate = cfg.sample_rate
        self.samples_per_frame = cfg.samples_per_code
        self.n_codebooks = cfg.quantizer.n_groups
        self._pad_index = decoder.fsq.lattice.neutral_index

    @property
    def conv_kernels(self) -> str:
        """What convolves: ``row_conv (n convolutions)`` and oneDNN for the rest, ``onednn``
        (packed) or ``aten``."""
        if self.row_convs:
            return f"row_conv ({self.row_convs} convolutions), onednn"
        return "onednn" if self.packed else "aten"

    def new_state(self) -> DecoderState:
        """A stream at its start (zero context, exactly like upstream's zero padding)."""
        context = [
            torch.zeros(ch, width, device=self.device, dtype=self._state_dtype)
            for ch, width in self.decoder.context_shapes
        ]
        return DecoderState(context)

    def reset(self, state: DecoderState) -> None:
        """Reuse ``state`` for a new utterance."""
        state.context = self.new_state().context  # fresh: decoded states are inference tensors
        state.frames_decoded = 0

    @torch.inference_mode()
    def decode(self, states: Sequence[DecoderState], codes: Sequence[Tensor]) -> list[Tensor]:
        """Decode each stream's new frames; return its new samples.

        ``codes[i]``: int tensor [n_codebooks, n_i] (any device; indices outside the codebook
        are replaced, see :mod:`fsq`). Returns float32 [n_i * samples_per_frame] per stream, on
        ``self.device``, and advances ``states[i]``. ``n_i == 0`` is allowed (empty output).
        """
        if len(states) != len(codes):
            raise ValueError("one codes tensor per state")
        for c in codes:
            if c.dim() != 2 or c.shape[0] != self.n_codebooks:
                raise ValueError(f"codes must be [{self.n_codebooks}, n], got {tuple(c.shape)}")
        live = [i for i, c in enumerate(codes) if c.shape[1] > 0]
        out = [torch.zeros(0, device=self.device) for _ in codes]
        if live:
            audio = self._decode_batch([states[i] for i in live], [codes[i] for i in live])
            for i, pcm in zip(live, audio, strict=True):
                out[i] = pcm
        return out

    def _decode_batch(self, states: list[DecoderState], codes: list[Tensor]) -> list[Tensor]:
        frames = [int(c.shape[1]) for c in codes]
        batch = self._pad_codes(codes, max(frames))  # [B, G, N]
        ctx = LeftContext(self._stack_context(states), frames)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.autocast):
            audio = self.decoder(batch, ctx)  # [B, 1, N * spf]
        audio = audio[:, 0].float()  # [B, N * spf]
        self._store_context(states, ctx.next)
        spf = self.samples_per_frame
        result = []
        for b, (state, n) in enumerate(zip(states, frames, strict=True)):
            state.frames_decoded += n
            result.append(audio[b, : n * spf])
        return result

    def _pad_codes(self, codes: list[Tensor], n_max: int) -> Tensor:
        """Right-pad every stream to ``n_max`` frames -> [B, G, n_max] int64 on the device."""
        codes = [c.to(self.device, torch.int64, non_blocking=True) for c in codes]
        if all(c.shape[1] == n_max for c in codes):
            return torch.stack(codes)
        batch = torch.full(
            (len(codes), self.n_codebooks, n_max), self._pad_index, device=self.device
        )
        for b, c in enumerate(codes):
            batch[b, :, : c.shape[1]] = c
        return batch

    def _stack_context(self, states: list[DecoderState]) -> list[Tensor]:
        """Per slot: [B, C, W]."""
        if len(states) == 1:
            return [t.unsqueeze(0) for t in states[0].context]
        n_slots = len(self.decoder.context_shapes)
        return [torch.stack([s.context[i] for s in states]) for i in range(n_slots)]

    @staticmethod
    def _store_context(states: list[DecoderState], nxt: list[Tensor]) -> None:
        for b, state in enumerate(states):
            state.context = [t[b] for t in nxt]  # [C, W] views of the per-slot [B, C, W]


def _pack_(decoder: FireflyDecoder, row_convs: bool) -> int:
    """Pack every convolution and linear layer of a CPU decoder, bf16 or fp32 (in place): with
    ``row_convs`` the convolutions that fit for ``row_conv``, the others for oneDNN. Returns how
    many went to ``row_conv``."""
    rows = 0
    for module in decoder.modules():
        if isinstance(module, CausalConv1d) and row_convs and module.pack_rows_():
            rows += 1
        elif isinstance(module, (CausalConv1d, CausalConvTranspose1d)):
            module.pack_()
    replace_linears_(decoder, PackedLinear.from_linear)
    return rows
