"""Fish-Speech 1.5 dual-autoregressive text-to-semantic transformer (spec §2).

* The **slow** transformer is a LLaMA: fused-QKV grouped-query attention, RoPE on consecutive
  pairs with a bf16-rounded cos/sin table, RMSNorm (normalised in fp32, cast, × weight), SwiGLU.
  It reads one ``[C+1]`` token column per position (§2.3) and yields logits over the whole
  vocabulary plus the un-normalised last hidden state.
* The **fast** transformer runs 8 positions per audio frame (slow hidden, then the embeddings of
  codebooks 0..6) and predicts codebooks 1..7 (§2.6), with explicit softmax attention.

The slow model uses a static KV cache with *slots* (:class:`KVCache`): a batch of sequences at
different positions decodes in one step (:meth:`DualARTransformer.decode_slow`); a prompt is
prefilled into one slot, possibly in chunks or after a cached prefix
(:meth:`DualARTransformer.prefill`). Shapes: B batch, S positions, D model dim, H query heads,
G KV heads, Dh head dim, C codebooks, V vocabulary, K codebook size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from streamtts.models.fish.llm.config import BlockConfig, FishConfig

# RoPE cos/sin tables are rounded to bf16 upstream, whatever the model dtype.
ROPE_TABLE_DTYPE = torch.bfloat16

# Keys read by slow attention are padded (masked) to a multiple of this: it buckets shapes and,
# on CPU, makes bf16 SDPA results bit-identical to attending over the whole static cache.
KV_LEN_MULTIPLE = 64

# attend(layer, q [B,H,S,Dh], k [B,G,S,Dh], v [B,G,S,Dh]) -> [B,H,S,Dh]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def padded_kv_len(kv_len: int, max_seq_len: int) -> int:
    """``kv_len`` rounded up to a multiple of :data:`KV_LEN_MULTIPLE`, capped at the cache size."""
    return min(-(-kv_len // KV_LEN_MULTIPLE) * KV_LEN_MULTIPLE, max_seq_len)


def rope_table(
    num_positions: int, head_dim: int, base: float, device: torch.device
) -> torch.Tensor:
    """Rotation table ``[num_positions, 2, Dh]`` in fp32: row 0 ``cos`` and row 1 ``±sin``.

    The angles are ``p / base^(2i/Dh)``; cos/sin are rounded to bf16 (upstream) and widened back.
    Row 0 holds ``cos_i`` at both 2i and 2i+1; row 1 holds ``-sin_i`` at 2i and ``+sin_i`` at
    2i+1, the layout :func:`apply_rope` multiplies with.
    """
    exponents = torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim
    inv_freq = 1.0 / (base**exponents)  # [Dh/2] fp32
    positions = torch.arange(num_positions, device=device)
    angle = torch.outer(positions, inv_freq)  # [P, Dh/2] fp32
    cos = torch.cos(angle).to(ROPE_TABLE_DTYPE).float()  # [P, Dh/2]
    sin = torch.sin(angle).to(ROPE_TABLE_DTYPE).float()
    cos_rows = cos.repeat_interleave(2, dim=-1)  # [P, Dh]
    sin_rows = torch.stack([-sin, sin], dim=-1).flatten(-2)  # [P, Dh]
    return torch.stack([cos_rows, sin_rows], dim=1)  # [P, 2, Dh]


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (2i, 2i+1) in fp32. x: [B,S,N,Dh]; table: [B|1, S, 2, Dh].

    Upstream computes ``(e·cos − o·sin, o·cos + e·sin)``; ``x·cos + swap(x)·(∓sin)`` rounds every
    product and sum identically (negation is exact), in fewer kernels.
    """
    x32 = x.float()  # [B,S,N,Dh]
    swapped = x32.reshape(*x32.shape[:-1], -1, 2).flip(-1).flatten(-2)  # (o0, e0, o1, e1...)
    cos = table[:, :, None, 0]  # [B|1,S,1,Dh]
    sin = table[:, :, None, 1]
    rotated: torch.Tensor = x32 * cos + swapped * sin
    return rotated.type_as(x)


def rotate_pairs(x32: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rope` at one position, before rounding: x32 [..., Dh] fp32, cos/sin [Dh].

    The same kernels on views (no table slicing per call). Not ``addcmul``: it fuses the
    multiply-add, which rounds fp32 products differently from upstream.
    """
    pairs = x32.view(*x32.shape[:-1], -1, 2)  # [..., Dh/2, 2]
    swapped = pairs.flip(-1).flatten(-2)  # (o0, e0, o1, e1...)
    rotated: torch.Tensor = x32 * cos + swapped * sin
    return rotated


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's rms_norm normalises a 16-bit x in fp32 and rounds once, as upstream's
        # ``x.float() * rsqrt(mean(x²) + eps)`` then ``type_as(x)`` does (bit-identical, tested),
        # in one call instead of seven.
        normed = F.rms_norm(x, (x.shape[-1],), eps=self.eps)
        out: torch.Tensor = normed * self.weight
        return out


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)
        self.w13: nn.Module | None = None  # w1 and w3 stacked, once fused

    def fuse_gate_up(self) -> None:
        """Replace ``w1`` and ``w3`` by one ``[2I, D]`` layer (one wide product per call)."""
        if self.w13 is not None:
            return
        inter, dim = self.w1.weight.shape
        fused = nn.Linear(dim, 2 * inter, bias=False, device="meta")
        fused.weight = nn.Parameter(
            torch.cat([self.w1.weight, self.w3.weight]), requires_grad=False
        )
        self.w13 = fused
        del self.w1, self.w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w13 is not None:
            gate, up = self.w13(x).chunk(2, dim=-1)
        else:
            gate, up = self.w1(x), self.w3(x)
        out: torch.Tensor = self.w2(F.silu(gate) * up)
        return out


def fuse_gate_up_(model: nn.Module) -> None:
    """:meth:`FeedForward.fuse_gate_up` on every feed-forward of ``model``."""
    for module in model.modules():
        if isinstance(module, FeedForward):
            module.fuse_gate_up()


@dataclass(frozen=True)
class FastPosition:
    """One layer's fast cache at the position being decoded."""

    keys: torch.Tensor  # [B, G, C, Dh] in fast_attention_dtype, written at ``pos``
    values: torch.Tensor  # [B, G, C, Dh]
    pos: int
    cos: torch.Tensor  # [Dh] the position's rotation rows (rope_table)
    sin: torch.Tensor  # [Dh]


class Attention(nn.Module):
    """Fused-QKV GQA projections; the attention is the caller's (:meth:`forward`), or the
    codebook pass's own at one position (:meth:`decode_position`)."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_kv_head = cfg.n_local_heads
        self.head_dim = cfg.head_dim
        qkv_dim = (cfg.n_head + 2 * cfg.n_local_heads) * cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, qkv_dim, bias=cfg.attention_qkv_bias)
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.dim, bias=False)
        # decode_position's attention by the fused ops' position_attention (same roundings,
        # its own sums): set where the layers are paired, so that every pass of the model
        # attends alike (streamtts.models.fish.fused.pairs.pair_linears_).
        self.own_kernel = False

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, attend: Attend, layer: int
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q_dim = self.n_head * self.head_dim
        kv_dim = self.n_kv_head * self.head_dim
        qk, v = self.wqkv(x).split([q_dim + kv_dim, kv_dim], dim=-1)
        heads = self.n_head + self.n_kv_head
        qk = apply_rope(qk.reshape(b, s, heads, self.head_dim), rope)  # [B,S,H+G,Dh]
        q, k = torch.split(qk, [self.n_head, self.n_kv_head], dim=2)  # [B,S,H,Dh], [B,S,G,Dh]
        v = v.view(b, s, self.n_kv_head, self.head_dim)
        y = attend(layer, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # [B,H,S,Dh]
        out: torch.Tensor = self.wo(y.transpose(1, 2).reshape(b, s, q_dim))
        return out

    def decode_position(self, x: torch.Tensor, at: FastPosition) -> torch.Tensor:
        """Attention of one new position over the ``pos + 1`` cached ones: x [B, D] → [B, D].

        Rounds where :func:`explicit_attention` over the masked cache rounds, but reads only
        the positions written so far (no mask), groups the query heads of each KV head instead
        of repeating keys, and multiplies in the cache's dtype (:func:`fast_attention_dtype`).
        """
        keys, values, pos = at.keys, at.values, at.pos
        b = x.shape[0]
        n_q, n_kv, dh = self.n_head, self.n_kv_head, self.head_dim
        qk, v = self.wqkv(x).split([(n_q + n_kv) * dh, n_kv * dh], dim=-1)
        qk = rotate_pairs(qk.float().view(b, n_q + n_kv, dh), at.cos, at.sin).type_as(x)
        keys.select(2, pos).copy_(qk[:, n_q:])  # [B,G,Dh]
        values.select(2, pos).copy_(v.view(b, n_kv, dh))
        scale = 1.0 / math.sqrt(dh)
        if self.own_kernel:
            y: torch.Tensor = torch.ops.streamtts_fused.position_attention(
                qk[:, :n_q], keys, values, pos, scale
            )  # [B, H·Dh]
        else:
            wide = keys.dtype
            q = qk[:, :n_q].to(wide).reshape(b * n_kv, n_q // n_kv, dh)  # [B·G,H/G,Dh]
            seen_k = keys.narrow(2, 0, pos + 1).flatten(0, 1)  # [B·G,P,Dh]
            seen_v = values.narrow(2, 0, pos + 1).flatten(0, 1)
            scores = torch.bmm(q, seen_k.transpose(1, 2)).type_as(x)  # [B·G,H/G,P]
            probs = torch.softmax(scores.mul_(scale), dim=-1).to(wide)
            y = torch.bmm(probs, seen_v).type_as(x)  # [B·G,H/G,Dh]
        out: torch.Tensor = self.wo(y.view(b, n_q * dh))
        return out


class TransformerBlock(nn.Module):
    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, attend: Attend, layer: int
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, attend, layer)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out

    def decode_position(self, x: torch.Tensor, at: FastPosition) -> torch.Tensor:
        """The block at one new position: x [B, D] → [B, D] (:meth:`Attention.decode_position`)."""
        h = x + self.attention.decode_position(self.attention_norm(x), at)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


def expand_kv(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """[B,G,S,Dh] → [B,H,S,Dh]: query head h reads KV head h // (H/G)."""
    return x.repeat_interleave(n_head // x.shape[1], dim=1)


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = attend) → an additive bias of the same shape: 0 or -inf."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill(mask.logical_not(), float("-inf"))


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """``softmax(q kᵀ / √Dh + bias) v`` in the model dtype.

    q: [B,H,S,Dh]; k, v: [B,G,L,Dh]; bias: [S, L] from :func:`attention_bias` → [B,H,S,Dh].
    """
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))  # [B,H,S,L]
    scores = scores + bias
    return torch.softmax(scores, dim=-1) @ v


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """One query per row over its cached keys, computed in fp32 (the CPU decode path).

    q: [B,H,1,Dh]; keys, values: [B,G,L,Dh]; bias: [B,1,1,L] fp32 (0 or -inf) → [B,H,1,Dh].
    torch's fused CPU kernel costs 0.2 ms per layer at 320 keys and 2.9 ms at 4096 on the dev
    CPU (its fixed costs are sized for long query blocks); these five kernels 0.04 and 0.2 ms.
    The result is the exact attention rounded once to the model dtype, where the fused kernel
    rounds the probabilities to bf16 first: outputs differ from it by at most one bf16 step.
    """
    b, h, _, dh = q.shape
    g = keys.shape[1]
    grouped = q.float().view(b, g, h // g, dh)  # [B,G,H/G,Dh]: query heads of one KV head
    scores = grouped @ keys.float().transpose(-1, -2) * (1.0 / math.sqrt(dh)) + bias  # [B,G,H/G,L]
    out = torch.softmax(scores, dim=-1) @ values.float()  # [B,G,H/G,Dh]
    return out.view(b, h, 1, dh).to(q.dtype)


def fast_attention_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """What the codebook pass multiplies its attention in: fp32 on the CPU, where oneDNN's
    bf16 kernel costs 17 µs for its 8x64 by 64x8 products and fp32 4.5 µs (the same fp32
    accumulation, rounded once to ``dtype`` either way); ``dtype`` elsewhere."""
    return torch.float32 if device.type == "cpu" else dtype


class KVCache:
    """Static KV caches.

    Slow: ``[n_layer, slots, G, max_seq, Dh]``; fast: ``[n_fast, slots, G, C, Dh]``. A slot holds
    one sequence; the fast cache rows are per batch row of the current decode step. The fast
    cache is in :func:`fast_attention_dtype` (fp32 on the CPU, holding 16-bit values exactly).
    """

    def __init__(
        self,
        config: FishConfig,
        slots: int,
        max_seq_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        slow, fast = config.slow_block, config.fast_block
        slow_shape = (slow.n_layer, slots, slow.n_local_heads, max_seq_len, slow.head_dim)
        fast_shape = (fast.n_layer, slots, fast.n_local_heads, config.num_codebooks, fast.head_dim)
        fast_dtype = fast_attention_dtype(dtype, torch.device(device))
        self.k = torch.zeros(slow_shape, dtype=dtype, device=device)
        self.v = torch.zeros(slow_shape, dtype=dtype, device=device)
        self.fast_k = torch.zeros(fast_shape, dtype=fast_dtype, device=device)
        self.fast_v = torch.zeros(fast_shape, dtype=fast_dtype, device=device)

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[3]

    def prefill_span(self, start_pos: int, length: int) -> tuple[int, int]:
        """A prefill of ``length`` positions from ``start_pos``: its end and the padded number
        of keys it attends over (:func:`padded_kv_len`); ValueError where it outruns the cache."""
        end = start_pos + length
        if end > self.max_seq_len:
            raise ValueError(f"prefill to position {end} exceeds the cache ({self.max_seq_len})")
        return end, padded_kv_len(end, self.max_seq_len)

    def copy_prefix(self, src_slot: int, dst_slot: int, length: int) -> None:
        """Copy the keys/values of positions ``[0, length)`` from one slot to another.

        Lets a shared prompt prefix (system message + voice reference) be prefilled once and
        reused: copy it, then :meth:`DualARTransformer.prefill` the rest from ``length``.
        """
        self.k[:, dst_slot, :, :length] = self.k[:, src_slot, :, :length]
        self.v[:, dst_slot, :, :length] = self.v[:, src_slot, :, :length]


@dataclass(frozen=True)
class SlowOutput:
    logits: torch.Tensor  # [..., V]
    hidden: torch.Tensor  # [..., D] last-layer output before the final norm


@dataclass(frozen=True)
class TrainOutput:
    logits: torch.Tensor  # [B, T, V]
    hidden: torch.Tensor  # [B, T, D]
    codebook_logits: torch.Tensor  # [B, T, C, K]; zeros where the next frame has no codes


class DualARTransformer(nn.Module):
    """The Fish-Speech 1.5 text-to-semantic model; parameter names match ``model.pth``."""

    def __init__(self, config: FishConfig, semantic_begin_id: int, semantic_end_id: int) -> None:
        super().__init__()
        self.config = config
        self.semantic_begin_id = semantic_begin_id
        self.semantic_end_id = semantic_end_id
        slow, fast = config.slow_block, config.fast_block
        c, k = config.num_codebooks, config.codebook_size
        self.embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.codebook_embeddings = nn.Embedding(k * c, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(slow) for _ in range(slow.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.fast_embeddings = nn.Embedding(k, fast.dim)
        self.fast_layers = nn.ModuleList(TransformerBlock(fast) for _ in range(fast.n_layer))
        self.fast_norm = RMSNorm(fast.dim, config.norm_eps)
        self.fast_output = nn.Linear(fast.dim, k, bias=False)
        # Decode-step attention: "sdpa" (torch's fused kernel, upstream's rounding), "fp32"
        # (:func:`decode_attention`), or "auto": fp32 for a 16-bit model on the CPU, where the
        # fused kernel is slow for one query; SDPA elsewhere (an fp32 model stays bit-exact).
        self.decode_kernel = "auto"
        self.reset_rope_tables(torch.device("cpu"))

    def reset_rope_tables(self, device: torch.device) -> None:
        """(Re)build the non-persistent RoPE tables on ``device`` (after loading onto meta)."""
        cfg = self.config
        self.slow_rope = rope_table(cfg.max_seq_len, cfg.head_dim, cfg.rope_base, device)
        self.fast_rope = rope_table(cfg.num_codebooks, cfg.fast_head_dim, cfg.rope_base, device)
        # Per fast position, its (cos, ±sin) rows [Dh]: no slicing in the codebook pass.
        self.fast_rope_rows = [(row[0], row[1]) for row in self.fast_rope]

    @property
    def dtype(self) -> torch.dtype:
        return self.embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embeddings.weight.device

    def allocate_cache(self, slots: int, max_seq_len: int | None = None) -> KVCache:
        seq = self.config.max_seq_len if max_seq_len is None else max_seq_len
        if seq > self.config.max_seq_len:
            raise ValueError(f"max_seq_len {seq} exceeds the model's {self.config.max_seq_len}")
        return KVCache(self.config, slots, seq, self.dtype, self.device)

    # ---- slow transformer -------------------------------------------------------------------

    def decodes_attention_in_fp32(self, device: torch.device) -> bool:
        """Whether :meth:`decode_slow` attends by :func:`decode_attention` (else by SDPA), for
        tokens on ``device`` (:attr:`decode_kernel`)."""
        return self.decode_kernel == "fp32" or (
            self.decode_kernel == "auto" and device.type == "cpu" and self.dtype != torch.float32
        )

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token columns [B, C+1, S] → [B, S, D] (spec §2.3)."""
        tokens = tokens.long()
        c, k = self.config.num_codebooks, self.config.codebook_size
        text = self.embeddings(tokens[:, 0])  # [B,S,D]
        offsets = torch.arange(c, device=tokens.device)[None, :, None] * k  # [1,C,1]
        vq = self.codebook_embeddings(tokens[:, 1:] + offsets)  # [B,C,S,D]
        vq_sum = vq.sum(dim=1)  # [B,S,D] one reduction in the model dtype
        row0 = tokens[:, 0]  # [B,S]
        is_semantic = (row0 >= self.semantic_begin_id) & (row0 <= self.semantic_end_id)
        x: torch.Tensor = text + torch.where(is_semantic[..., None], vq_sum, 0.0)
        return x

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.norm(hidden)
        if self.output is None:
            return F.linear(normed, self.embeddings.weight)
        logits: torch.Tensor = self.output(normed)
        return logits

    def _slow_stack(self, x: torch.Tensor, rope: torch.Tensor, attend: Attend) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, attend, i)
        return x

    def forward_slow_train(self, tokens: torch.Tensor) -> SlowOutput:
        """Causal forward without a cache: tokens [B, C+1, T] → logits [B,T,V], hidden [B,T,D]."""
        n_head = self.config.n_head

        def attend(_: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k, v = expand_kv(k, n_head), expand_kv(v, n_head)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        x = self.embed(tokens)  # [B,T,D]
        rope = self.slow_rope[: x.shape[1]][None]  # [1,T,2,Dh]
        hidden = self._slow_stack(x, rope, attend)
        return SlowOutput(self._head(hidden), hidden)

    def prefill(
        self,
        cache: KVCache,
        tokens: torch.Tensor,
        slot: int,
        start_pos: int = 0,
        return_all: bool = False,
    ) -> SlowOutput:
        """Run positions ``start_pos .. start_pos+S-1`` of one sequence into cache ``slot``.

        tokens: [C+1, S]. Keys before ``start_pos`` must already be in the slot (an earlier
        chunk or a copied prompt prefix). Returns logits/hidden of the last position ([V], [D]),
        or of all positions ([S, V], [S, D]) with ``return_all``.
        """
        tokens = tokens.to(self.device)
        end, kv_len = cache.prefill_span(start_pos, tokens.shape[-1])
        n_head = self.config.n_head
        query_pos = torch.arange(start_pos, end, device=tokens.device)  # [S]
        key_pos = torch.arange(kv_len, device=tokens.device)  # [L]
        mask = key_pos[None, :] <= query_pos[:, None]  # [S, L]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            cache.k[layer, slot, :, start_pos:end] = k[0]
            cache.v[layer, slot, :, start_pos:end] = v[0]
            keys = cache.k[layer, slot : slot + 1, :, :kv_len]  # [1,G,L,Dh]
            values = cache.v[layer, slot : slot + 1, :, :kv_len]
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, enable_gqa=n_head != keys.shape[1]
            )

        x = self.embed(tokens[None])  # [1,S,D]
        rope = self.slow_rope[start_pos:end][None]  # [1,S,2,Dh]
        hidden = self._slow_stack(x, rope, attend)[0]  # [S,D]
        if not return_all:
            hidden = hidden[-1]  # [D]
        return SlowOutput(self._head(hidden), hidden)

    def decode_slow(
        self,
        cache: KVCache,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        kv_len: int,
    ) -> SlowOutput:
        """One slow step for a batch of sequences at different positions.

        tokens: [B, C+1, 1]; slots: [B] int64 (distinct); positions: [B] int64 (where each token
        goes); ``kv_len`` > max(positions), a host-side bound (keys beyond it, after padding to
        :data:`KV_LEN_MULTIPLE`, are not read; keys past each row's own position are masked out).
        Returns logits [B, V], hidden [B, D].
        """
        n_head = self.config.n_head
        kv_len = padded_kv_len(kv_len, cache.max_seq_len)
        key_pos = torch.arange(kv_len, device=tokens.device)  # [L]
        mask = (key_pos[None, :] <= positions[:, None])[:, None, None, :]  # [B,1,1,L]
        explicit = self.decodes_attention_in_fp32(tokens.device)
        bias = attention_bias(mask, torch.float32) if explicit else mask  # [B,1,1,L]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # Written through the whole cache, not through a view of one layer: in a compiled
            # step, a write through a view copied every layer of the cache (+13 ms per step).
            layer_index = torch.full_like(slots, layer)  # [B]
            cache.k[layer_index, slots, :, positions] = k[:, :, 0]  # [B,G,Dh]
            cache.v[layer_index, slots, :, positions] = v[:, :, 0]
            layer_k, layer_v = cache.k[layer], cache.v[layer]  # [slots,G,max_seq,Dh]
            keys = layer_k[:, :, :kv_len].index_select(0, slots)  # [B,G,L,Dh]
            values = layer_v[:, :, :kv_len].index_select(0, slots)
            if explicit:
                return decode_attention(q, keys, values, bias)
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, enable_gqa=n_head != keys.shape[1]
            )

        x = self.embed(tokens)  # [B,1,D]
        rope = self.slow_rope[positions][:, None]  # [B,1,2,Dh]
        hidden = self._slow_stack(x, rope, attend)[:, 0]  # [B,D]
        return SlowOutput(self._head(hidden), hidden)

    # ---- fast transformer -------------------------------------------------------------------

    def _fast_stack(self, x: torch.Tensor, rope: torch.Tensor, attend: Attend) -> torch.Tensor:
        for i, layer in enumerate(self.fast_layers):
            x = layer(x, rope, attend, i)
        logits: torch.Tensor = self.fast_output(self.fast_norm(x))
        return logits

    def fast_step(
        self, cache: KVCache, x: torch.Tensor, codebook_pos: int, logits: bool = True
    ) -> torch.Tensor:
        """One fast position for the whole batch: x [B, D] at position ``codebook_pos`` → [B, K].

        Position 0 takes the slow hidden state and starts the fast cache rows [0, B) anew;
        position k ≥ 1 takes the embedding of codebook k-1 and yields the logits of codebook k.
        Without ``logits`` the output head is skipped and the last hidden state [B, D] returned
        (position 0's logits are unused upstream).
        """
        b = x.shape[0]
        cos, sin = self.fast_rope_rows[codebook_pos]
        for layer, block in enumerate(self.fast_layers):
            assert isinstance(block, TransformerBlock)
            keys, values = cache.fast_k[layer, :b], cache.fast_v[layer, :b]  # [B,G,C,Dh]
            x = block.decode_position(x, FastPosition(keys, values, codebook_pos, cos, sin))
        if not logits:
            return x
        out: torch.Tensor = self.fast_output(self.fast_norm(x))
        return out

    def forward_fast_train(self, hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Teacher-forced fast pass: hidden [N, D], codes [N, C-1] (codebooks 0..C-2) → [N,C,K]."""
        x = torch.cat([hidden[:, None], self.fast_embeddings(codes.long())], dim=1)  # [N,C,D]
        c = x.shape[1]
        mask = torch.ones(c, c, dtype=torch.bool, device=x.device).tril()  # [C, C]
        bias = attention_bias(mask, x.dtype)  # [C, C]

        def attend(_: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return explicit_attention(q, k, v, bias)

        return self._fast_stack(x, self.fast_rope[:c][None], attend)

    def forward_train(self, tokens: torch.Tensor) -> TrainOutput:
        """The training-path forward (spec §2.6): tokens [B, C+1, T].

        Position t's fast input is the slow hidden state at t followed by codebooks 0..C-2 of
        frame t+1; positions whose next-frame codes are all zero (and the last one) are skipped
        and their codebook logits left as zeros.
        """
        slow = self.forward_slow_train(tokens)
        b, t, d = slow.hidden.shape
        next_codes = F.pad(tokens[:, 1:-1, 1:], (0, 1))  # [B, C-1, T] codes of frame t+1
        next_codes = next_codes.transpose(1, 2).reshape(b * t, -1)  # [B*T, C-1]
        keep = (next_codes != 0).any(dim=-1)  # [B*T]
        c, k = self.config.num_codebooks, self.config.codebook_size
        out = torch.zeros(b * t, c, k, dtype=slow.logits.dtype, device=tokens.device)
        if bool(keep.any()):  # training path: a host sync is fine here
            hidden = slow.hidden.reshape(b * t, d)[keep]  # [N, D]
            out[keep] = self.forward_fast_train(hidden, next_codes[keep])
        return TrainOutput(slow.logits, slow.hidden, out.view(b, t, c, k))
