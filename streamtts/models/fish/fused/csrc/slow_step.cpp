// The slow transformer's decode step of Fish-Speech 1.5 as one op: streamtts_fused::slow_step.
//
// The same ATen calls, in the same order and with the same arguments, as the Python step
// (streamtts.models.fish.llm.llama.DualARTransformer.decode_slow over packed layers: embed,
// the RoPE rows of each row's position, every block with its KV written at (slot, position),
// attention by decode_attention or SDPA, the head), so every result bit is the Python step's;
// but the rotation of q and k, one loop with the same roundings (packed_ops.h:
// rotate_pairs_rounded), and the residual sums, made in row_linear's epilogue with add's
// rounding where the weights are paired (packed_linear_add). It removes the interpreter between
// the ~30 kernels of each of the 24 layers; a decode step's products are made by a product team
// where the weights are paired (product_team.h; the same bits). Built at first use by
// streamtts/models/fish/fused/library.py. Shapes: B batch, D model dim, V vocabulary, H query
// heads, G KV heads, Dh head dim, C codebooks, L keys read (padded kv_len).

#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include <ATen/TensorIndexing.h>

#include "packed_ops.h"
#include "product_team.h"

namespace {

using at::Tensor;
using at::indexing::Slice;
using streamtts_fused::check_layers;
using streamtts_fused::EachProduct;
using streamtts_fused::feed_forward_add;
using streamtts_fused::head_outputs;
using streamtts_fused::kNormsPerLayer;
using streamtts_fused::kTensorsPerLayer;
using streamtts_fused::rms_norm;
using streamtts_fused::rotate_pairs_rounded;

// DualARTransformer.embed: token columns [B, C+1, S] -> [B, S, D].
Tensor embed(const Tensor& tokens_in, const Tensor& embeddings, const Tensor& codebook_embeddings,
             int64_t codebook_size, int64_t semantic_begin, int64_t semantic_end) {
  const Tensor tokens = tokens_in.to(at::kLong);
  const int64_t c = tokens.size(1) - 1;
  const Tensor row0 = tokens.select(1, 0);         // [B,S]
  Tensor text = at::embedding(embeddings, row0);  // [B,S,D]
  const auto long_options = at::TensorOptions().device(tokens.device()).dtype(at::kLong);
  Tensor offsets = at::arange(c, long_options).unsqueeze(0).unsqueeze(2).mul(codebook_size);
  Tensor vq = at::embedding(codebook_embeddings, tokens.narrow(1, 1, c).add(offsets));  // [B,C,S,D]
  Tensor vq_sum = vq.sum(1);  // [B,S,D]
  Tensor is_semantic = row0.ge(semantic_begin).bitwise_and(row0.le(semantic_end));
  return text.add(at::where(is_semantic.unsqueeze(-1), vq_sum, at::Scalar(0.0)));
}

// TransformerBlock.forward over rows x [B, S, D] with the RoPE rows cos, sin [B·S, Dh]:
// `attend(q [B,H,S,Dh], k [B,G,S,Dh], v [B,G,S,Dh]) -> [B,H,S,Dh]` writes the layer's keys and
// values and attends (Attention.forward's `attend`). -> [B, S, D].
template <typename Attend, typename Products = EachProduct>
Tensor slow_block(const Tensor& x, const Tensor* norm, const Tensor* w,
                  const std::optional<Tensor>& qkv_bias, const Tensor& cos, const Tensor& sin,
                  int64_t n_q, int64_t n_kv, int64_t dh, double eps, const Attend& attend,
                  const Products& products = {}) {
  const int64_t b = x.size(0), s = x.size(1);
  const int64_t q_dim = n_q * dh, kv_dim = n_kv * dh, heads = n_q + n_kv;
  Tensor qkv = products.linear(rms_norm(x, norm[0], eps), w[0], qkv_bias);  // [B,S,(H+2G)Dh]
  Tensor qk = rotate_pairs_rounded(qkv.view({b * s, -1}), heads, dh, cos, sin)
                  .view({b, s, heads, dh});  // [B,S,H+G,Dh]
  std::vector<Tensor> qk_parts = qk.split_with_sizes({n_q, n_kv}, 2);
  Tensor q = qk_parts[0].transpose(1, 2);  // [B,H,S,Dh]
  Tensor k = qk_parts[1].transpose(1, 2);  // [B,G,S,Dh]
  Tensor v = qkv.narrow(-1, q_dim + kv_dim, kv_dim).view({b, s, n_kv, dh}).transpose(1, 2);
  Tensor y = attend(q, k, v);  // [B,H,S,Dh]
  Tensor h = products.linear_add(y.transpose(1, 2).reshape({b, s, q_dim}), w[1], std::nullopt, x);
  return feed_forward_add(rms_norm(h, norm[1], eps), w[2], w[3], h, products);
}

// DualARTransformer._head: the final norm, then the packed head (or the tied embeddings).
template <typename Products = EachProduct>
Tensor head(const Tensor& hidden, const Tensor& final_norm, const std::optional<Tensor>& output,
            const Tensor& embeddings, double eps, const Products& products = {}) {
  Tensor normed = rms_norm(hidden, final_norm, eps);
  const int64_t vocab = embeddings.size(0);
  return output.has_value() ? head_outputs(products.linear(normed, *output, std::nullopt), vocab)
                            : at::linear(normed, embeddings);
}

// tokens [B, C+1, 1]; slots, positions [B] int64; kv_len the padded number of keys read.
// Writes each layer's key and value at (slot, position) of cache_k/cache_v [L, slots, G, T, Dh].
// output: the packed head, or none for tied embeddings. -> (logits [B, V], hidden [B, D]).
std::tuple<Tensor, Tensor> slow_step(
    const Tensor& tokens, const Tensor& slots, const Tensor& positions, int64_t kv_len,
    at::TensorList norms, at::TensorList packed, const c10::List<std::optional<Tensor>>& qkv_bias,
    const Tensor& final_norm, const std::optional<Tensor>& output, const Tensor& embeddings,
    const Tensor& codebook_embeddings, const Tensor& rope, const Tensor& cache_k,
    const Tensor& cache_v, int64_t codebook_size, int64_t semantic_begin, int64_t semantic_end,
    int64_t n_q, int64_t n_kv, int64_t dh, double eps, bool fp32_attention) {
  const int64_t b = tokens.size(0);
  const int64_t n_layers = static_cast<int64_t>(qkv_bias.size());
  check_layers("slow_step", norms, packed, n_layers);
  TORCH_CHECK(tokens.dim() == 3 && tokens.size(2) == 1, "slow_step: tokens must be [B, C+1, 1]");
  TORCH_CHECK(slots.size(0) == b && positions.size(0) == b,
              "slow_step: one slot and one position per row");
  TORCH_CHECK(kv_len > 0 && kv_len <= cache_k.size(3), "slow_step: kv_len out of the cache");
  const auto device = tokens.device();
  Tensor key_pos = at::arange(kv_len, at::TensorOptions().device(device).dtype(at::kLong));
  // [B, 1, 1, L]
  Tensor mask = key_pos.unsqueeze(0).le(positions.unsqueeze(1)).unsqueeze(1).unsqueeze(1);
  Tensor bias;  // attention_bias: 0 or -inf, fp32
  if (fp32_attention) {
    bias = at::zeros(mask.sizes(), at::TensorOptions().device(device).dtype(at::kFloat))
               .masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  }
  // The step, its products made by `products` (EachProduct, or a team's).
  auto step = [&](const auto& products) -> std::tuple<Tensor, Tensor> {
    Tensor x = embed(tokens, embeddings, codebook_embeddings, codebook_size, semantic_begin,
                     semantic_end);  // [B,1,D]
    const Tensor table = rope.index({positions});  // [B,2,Dh]
    const Tensor cos = table.select(1, 0);         // [B,Dh] (apply_rope)
    const Tensor sin = table.select(1, 1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    for (int64_t l = 0; l < n_layers; ++l) {
      const Tensor* layer_norms = &norms[kNormsPerLayer * l];
      const Tensor* layer_weights = &packed[kTensorsPerLayer * l];
      x = slow_block(x, layer_norms, layer_weights, qkv_bias.get(l), cos, sin, n_q, n_kv, dh, eps,
                     [&](const Tensor& q, const Tensor& k, const Tensor& v) {
        // Written through the whole cache, as decode_slow writes it.
        Tensor layer_index = at::full_like(slots, l);
        Tensor(cache_k).index_put_({layer_index, slots, Slice(), positions}, k.select(2, 0));
        Tensor(cache_v).index_put_({layer_index, slots, Slice(), positions}, v.select(2, 0));
        // [B,G,L,Dh]
        Tensor keys = cache_k.select(0, l).narrow(2, 0, kv_len).index_select(0, slots);
        Tensor values = cache_v.select(0, l).narrow(2, 0, kv_len).index_select(0, slots);
        if (!fp32_attention) {
          return at::scaled_dot_product_attention(q, keys, values, mask, 0.0, false, std::nullopt,
                                                  n_q != keys.size(1));
        }
        // decode_attention
        Tensor grouped = q.to(at::kFloat).view({b, n_kv, n_q / n_kv, dh});  // [B,G,H/G,Dh]
        Tensor scores =
            at::matmul(grouped, keys.to(at::kFloat).transpose(-1, -2)).mul(scale).add(bias);
        return at::matmul(at::softmax(scores, -1), values.to(at::kFloat))
            .view({b, n_q, 1, dh})
            .to(q.scalar_type());
      }, products);
    }
    Tensor hidden = x.select(1, 0);  // [B,D]
    // [B,V], [B,D]
    return {head(hidden, final_norm, output, embeddings, eps, products), hidden};
  };
  std::vector<Tensor> order(packed.begin(), packed.end());  // the products in the step's order
  if (output.has_value()) order.push_back(*output);
  return streamtts_fused::with_products(std::move(order), b, step);
}

// DualARTransformer.prefill: the prompt's tokens [C+1, S] at positions start_pos .. +S-1 of
// cache slot `slot` (the keys before start_pos already there), attending by SDPA with the mask
// over the padded kv_len keys, as the Python prefill does. -> (logits, hidden) of the last
// position ([V], [D]), or of all of them ([S, V], [S, D]) with all_positions.
std::tuple<Tensor, Tensor> slow_prefill(
    const Tensor& tokens, int64_t slot, int64_t start_pos, int64_t kv_len, at::TensorList norms,
    at::TensorList packed, const c10::List<std::optional<Tensor>>& qkv_bias,
    const Tensor& final_norm, const std::optional<Tensor>& output, const Tensor& embeddings,
    const Tensor& codebook_embeddings, const Tensor& rope, const Tensor& cache_k,
    const Tensor& cache_v, int64_t codebook_size, int64_t semantic_begin, int64_t semantic_end,
    int64_t n_q, int64_t n_kv, int64_t dh, double eps, bool all_positions) {
  const int64_t n_layers = static_cast<int64_t>(qkv_bias.size());
  check_layers("slow_prefill", norms, packed, n_layers);
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(1) > 0, "slow_prefill: tokens must be [C+1, S]");
  const int64_t s = tokens.size(1), end = start_pos + s;
  TORCH_CHECK(slot >= 0 && slot < cache_k.size(1), "slow_prefill: no cache slot ", slot);
  TORCH_CHECK(start_pos >= 0 && end <= kv_len && kv_len <= cache_k.size(3),
              "slow_prefill: positions ", start_pos, "..", end, " and kv_len ", kv_len,
              " out of the cache (", cache_k.size(3), ")");
  const auto long_options = at::TensorOptions().device(tokens.device()).dtype(at::kLong);
  Tensor query_pos = at::arange(start_pos, end, long_options);  // [S]
  Tensor key_pos = at::arange(kv_len, long_options);           // [L]
  Tensor mask = key_pos.unsqueeze(0).le(query_pos.unsqueeze(1));  // [S,L]
  Tensor x = embed(tokens.unsqueeze(0), embeddings, codebook_embeddings, codebook_size,
                   semantic_begin, semantic_end);  // [1,S,D]
  const Tensor table = rope.narrow(0, start_pos, s);  // [S,2,Dh]
  const Tensor cos = table.select(1, 0);              // [S,Dh]
  const Tensor sin = table.select(1, 1);
  for (int64_t l = 0; l < n_layers; ++l) {
    x = slow_block(x, &norms[kNormsPerLayer * l], &packed[kTensorsPerLayer * l], qkv_bias.get(l),
                   cos, sin, n_q, n_kv, dh, eps, [&](const Tensor& q, const Tensor& k,
                                                      const Tensor& v) {
      Tensor layer_k = cache_k.select(0, l), layer_v = cache_v.select(0, l);  // [slots,G,T,Dh]
      layer_k.select(0, slot).narrow(1, start_pos, s).copy_(k.select(0, 0));
      layer_v.select(0, slot).narrow(1, start_pos, s).copy_(v.select(0, 0));
      Tensor keys = layer_k.narrow(0, slot, 1).narrow(2, 0, kv_len);  // [1,G,L,Dh]
      Tensor values = layer_v.narrow(0, slot, 1).narrow(2, 0, kv_len);
      return at::scaled_dot_product_attention(q, keys, values, mask, 0.0, false, std::nullopt,
                                              n_q != keys.size(1));
    });
  }
  Tensor hidden = x.select(0, 0);  // [S,D]
  if (!all_positions) hidden = hidden.select(0, s - 1);  // [D]
  return {head(hidden, final_norm, output, embeddings, eps), hidden};
}

}  // namespace

// A catch-all kernel: the packed weights are MkldnnCPU tensors, the rest plain CPU ones.
TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def(
      "slow_step(Tensor tokens, Tensor slots, Tensor positions, int kv_len, Tensor[] norms, "
      "Tensor[] packed, Tensor?[] qkv_bias, Tensor final_norm, Tensor? output, "
      "Tensor embeddings, Tensor codebook_embeddings, Tensor rope, Tensor(a!) cache_k, "
      "Tensor(b!) cache_v, int codebook_size, int semantic_begin, int semantic_end, int n_q, "
      "int n_kv, int dh, float eps, bool fp32_attention) -> (Tensor, Tensor)",
      &slow_step);
  m.def(
      "slow_prefill(Tensor tokens, int slot, int start_pos, int kv_len, Tensor[] norms, "
      "Tensor[] packed, Tensor?[] qkv_bias, Tensor final_norm, Tensor? output, "
      "Tensor embeddings, Tensor codebook_embeddings, Tensor rope, Tensor(a!) cache_k, "
      "Tensor(b!) cache_v, int codebook_size, int semantic_begin, int semantic_end, int n_q, "
      "int n_kv, int dh, float eps, bool all_positions) -> (Tensor, Tensor)",
      &slow_prefill);
}
