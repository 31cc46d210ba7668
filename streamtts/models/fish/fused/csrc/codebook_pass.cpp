// The codebook pass of Fish-Speech 1.5 as one op: streamtts_fused::codebook_pass.
//
// The same ATen calls, in the same order and with the same arguments, as the Python pass
// (streamtts.models.fish.llm.generate.fast_codes over packed layers: DualARTransformer.fast_step,
// TransformerBlock.decode_position), so every result bit is the Python pass's; but the rotation
// of q and k, one loop with the same roundings (packed_ops.h: rotate_pairs_rounded), the
// residual sums, made in row_linear's epilogue with add's rounding where the weights are paired
// (packed_linear_add), and a 16-bit codebook's draw, which both passes make with sample_tokens
// (sample.cpp). What it removes is the interpreter between ~900 small kernels a frame.
// Where the weights are paired and the rows a decode step's few, a product team makes the
// products (product_team.h): the other threads read the next weight ahead while this one runs
// the small ops between products, with the same bits.
// Built at first use by streamtts/models/fish/fused/library.py. Shapes: B batch, D model dim,
// H query heads, G KV heads, Dh head dim, C codebooks, K codebook size, W repetition window,
// L layers.

#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include "packed_ops.h"
#include "product_team.h"

namespace {

using at::Tensor;
using streamtts_fused::check_layers;
using streamtts_fused::feed_forward_add;
using streamtts_fused::head_outputs;
using streamtts_fused::kNormsPerLayer;
using streamtts_fused::kTensorsPerLayer;
using streamtts_fused::position_attention;
using streamtts_fused::rms_norm;
using streamtts_fused::rotate_pairs_rounded;
using streamtts_fused::sample_tokens;

constexpr double kMinTemperature = 1e-5;  // sampling.MIN_TEMPERATURE

struct Layers {
  std::vector<Tensor> norms;   // [2L] of [D]
  std::vector<Tensor> packed;  // [4L]
  c10::List<std::optional<Tensor>> qkv_bias;  // [L]
  Tensor rope;                 // [C, 2, Dh] fp32: cos, ±sin rows per position
  Tensor fast_k, fast_v;       // [L, slots, G, C, Dh] in the attention dtype
  int64_t n_q, n_kv, dh;
  double eps;
};

// keys[:, :, pos] = qk[:, n_q:] and values[:, :, pos] = v: keys, values [B, G, C, Dh]; qk
// [B, H+G, Dh]; v [B, G·Dh]. 16-bit rows into an fp32 cache (the paired layers' own kernel):
// widened in one loop, exactly as the copies widen them; other dtypes by the copies.
void write_position(const Tensor& keys, const Tensor& values, const Tensor& qk, const Tensor& v,
                    int64_t n_q, int64_t pos) {
  const int64_t b = keys.size(0), g = keys.size(1), dh = keys.size(3);
  if (keys.scalar_type() != at::kFloat || values.scalar_type() != at::kFloat ||
      qk.scalar_type() != at::kBFloat16 || v.scalar_type() != at::kBFloat16 ||
      keys.stride(3) != 1 || values.stride(3) != 1 || !qk.is_contiguous() || v.stride(1) != 1) {
    keys.select(2, pos).copy_(qk.narrow(1, n_q, g));  // [B,G,Dh]
    values.select(2, pos).copy_(v.view({b, g, dh}));
    return;
  }
  float* key_data = keys.mutable_data_ptr<float>() + pos * keys.stride(2);
  float* value_data = values.mutable_data_ptr<float>() + pos * values.stride(2);
  const at::BFloat16* k_rows = qk.const_data_ptr<at::BFloat16>() + n_q * dh;
  const at::BFloat16* v_rows = v.const_data_ptr<at::BFloat16>();
  for (int64_t row = 0; row < b; ++row) {
    for (int64_t head = 0; head < g; ++head) {
      float* key = key_data + row * keys.stride(0) + head * keys.stride(1);
      float* value = value_data + row * values.stride(0) + head * values.stride(1);
      const at::BFloat16* k = k_rows + (row * qk.size(1) + head) * dh;
      const at::BFloat16* vh = v_rows + row * v.stride(0) + head * dh;
      for (int64_t d = 0; d < dh; ++d) {
        key[d] = static_cast<float>(k[d]);
        value[d] = static_cast<float>(vh[d]);
      }
    }
  }
}

// Every layer at fast position `pos`: x [B, D] -> [B, D] (TransformerBlock.decode_position).
template <class Products>
Tensor decode_position(Tensor x, int64_t pos, const Layers& layers, const Products& products) {
  const int64_t b = x.size(0);
  const int64_t n_q = layers.n_q, n_kv = layers.n_kv, dh = layers.dh;
  const auto dtype = x.scalar_type();
  const Tensor cos = layers.rope.select(0, pos).select(0, 0);  // [Dh]
  const Tensor sin = layers.rope.select(0, pos).select(0, 1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const int64_t count = static_cast<int64_t>(layers.qkv_bias.size());
  for (int64_t l = 0; l < count; ++l) {
    const Tensor keys = layers.fast_k.select(0, l).narrow(0, 0, b);  // [B,G,C,Dh]
    const Tensor values = layers.fast_v.select(0, l).narrow(0, 0, b);
    const Tensor* norm = &layers.norms[kNormsPerLayer * l];
    const Tensor* packed = &layers.packed[kTensorsPerLayer * l];
    // Attention.decode_position
    Tensor normed = rms_norm(x, norm[0], layers.eps);
    Tensor qkv = products.linear(normed, packed[0], layers.qkv_bias.get(l));
    Tensor v = qkv.narrow(-1, (n_q + n_kv) * dh, n_kv * dh);  // [B, G·Dh]
    Tensor qk = rotate_pairs_rounded(qkv, n_q + n_kv, dh, cos, sin);  // [B,H+G,Dh]
    write_position(keys, values, qk, v, n_q, pos);
    Tensor y;  // [B, H·Dh]
    if (!packed[0].is_mkldnn()) {  // paired layers: Attention.own_kernel
      y = position_attention(qk.narrow(1, 0, n_q), keys, values, pos, scale);
    } else {
      const auto wide = keys.scalar_type();
      // [B·G,H/G,Dh]
      Tensor q = qk.narrow(1, 0, n_q).to(wide).reshape({b * n_kv, n_q / n_kv, dh});
      Tensor seen_k = keys.narrow(2, 0, pos + 1).flatten(0, 1);  // [B·G,P,Dh]
      Tensor seen_v = values.narrow(2, 0, pos + 1).flatten(0, 1);
      Tensor scores = at::bmm(q, seen_k.transpose(1, 2)).to(dtype);  // [B·G,H/G,P]
      Tensor probs = at::softmax(scores.mul_(scale), -1).to(wide);
      y = at::bmm(probs, seen_v).to(dtype).view({b, n_q * dh});  // [B·G,H/G,Dh] as [B, H·Dh]
    }
    Tensor h = products.linear_add(y, packed[1], std::nullopt, x);
    x = feed_forward_add(rms_norm(h, norm[1], layers.eps), packed[2], packed[3], h, products);
  }
  return x;
}

// sampling.sample for K < COUNTING_MIN_VOCAB: logits [B, K] -> [B] int64. 16-bit logits take
// sample_tokens, as the Python sample() does; fp32 ones the Python calls with top-p by sorting.
Tensor sample(Tensor logits, const Tensor& temperature, const Tensor& top_p,
              const Tensor& penalty, const std::optional<Tensor>& window, const Tensor& noise) {
  const auto dtype = logits.scalar_type();
  if (logits.element_size() == 2) {
    return sample_tokens(logits, temperature, top_p, penalty, window, noise);
  }
  if (window.has_value()) {  // apply_repetition_penalty
    Tensor index = window->to(at::kLong);  // [B, W]
    Tensor score = logits.gather(-1, index).to(at::kFloat);
    Tensor r = penalty.unsqueeze(1);  // [B, 1]
    score = at::where(score.lt(0), score.mul(r), score.div(r)).to(dtype);
    logits = logits.scatter(-1, index, score);
  }
  // top_p_filter_by_sorting
  auto [sorted_logits, sorted_index] = at::sort(logits, -1, /*descending=*/true);
  Tensor cum_probs = at::cumsum(at::softmax(sorted_logits, -1), -1);  // [B, K]
  Tensor remove_sorted = cum_probs.gt(top_p.to(cum_probs.scalar_type()).unsqueeze(1));
  remove_sorted.select(1, 0).fill_(false);
  Tensor remove = remove_sorted.scatter(-1, sorted_index, remove_sorted);
  logits = logits.masked_fill(remove, -std::numeric_limits<double>::infinity());
  // apply_temperature, softmax, exponential_race
  Tensor tau = temperature.clamp_min(kMinTemperature).unsqueeze(1);  // [B, 1]
  logits = logits.to(at::kFloat).div(tau).to(dtype);
  Tensor race = at::softmax(logits, -1).div(noise).to(at::kFloat);
  return at::argmax(race, -1);
}

// generate.fast_codes: hidden [B, D], code0 [B] int64 -> codebooks 1..C-1 [B, C-1] int64.
// windows [B, C+1, W] int64 or None; noise [B, C-1, K] in the model dtype. Where the layers and
// the head are paired and the rows few, a product team makes the products (product_team.h).
Tensor codebook_pass(const Tensor& hidden, const Tensor& code0, at::TensorList norms,
                     at::TensorList packed, const c10::List<std::optional<Tensor>>& qkv_bias,
                     const Tensor& final_norm, const Tensor& output, const Tensor& embeddings,
                     const Tensor& rope, const Tensor& fast_k, const Tensor& fast_v,
                     const Tensor& temperature, const Tensor& top_p, const Tensor& penalty,
                     const std::optional<Tensor>& windows, const Tensor& noise, int64_t n_q,
                     int64_t n_kv, int64_t dh, double eps) {
  const int64_t n_layers = static_cast<int64_t>(qkv_bias.size());
  check_layers("codebook_pass", norms, packed, n_layers);
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(0) <= fast_k.size(1),
              "codebook_pass: hidden must be [B, D] with B at most the cache's slots");
  const Layers layers{std::vector<Tensor>(norms.begin(), norms.end()),
                      std::vector<Tensor>(packed.begin(), packed.end()),
                      qkv_bias,
                      rope,
                      fast_k,
                      fast_v,
                      n_q,
                      n_kv,
                      dh,
                      eps};
  const int64_t codebooks = fast_k.size(3);
  // The products in the pass's order: every layer at position 0, then at each later position
  // every layer and the head.
  std::vector<Tensor> order;
  for (int64_t pos = 0; pos < codebooks; ++pos) {
    order.insert(order.end(), layers.packed.begin(), layers.packed.end());
    if (pos > 0) order.push_back(output);
  }
  auto pass = [&](const auto& products) {
    decode_position(hidden, 0, layers, products);  // position 0: its logits are unused upstream
    Tensor code = code0;
    std::vector<Tensor> codes;
    codes.reserve(codebooks - 1);
    for (int64_t k = 1; k < codebooks; ++k) {
      // [B, D]
      Tensor x = decode_position(at::embedding(embeddings, code), k, layers, products);
      Tensor logits = head_outputs(
          products.linear(rms_norm(x, final_norm, eps), output, std::nullopt),
          embeddings.size(0));  // [B, K]
      std::optional<Tensor> window;
      if (windows.has_value()) window = windows->select(1, k + 1);  // row k+1: codebook k
      code = sample(logits, temperature, top_p, penalty, window, noise.select(1, k - 1));
      codes.push_back(code);
    }
    return at::stack(codes, 1);
  };
  return streamtts_fused::with_products(std::move(order), hidden.size(0), pass);
}

}  // namespace

// A catch-all kernel: the packed weights are MkldnnCPU tensors, the rest plain CPU ones.
TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def(
      "codebook_pass(Tensor hidden, Tensor code0, Tensor[] norms, Tensor[] packed, "
      "Tensor?[] qkv_bias, Tensor final_norm, Tensor output, Tensor embeddings, Tensor rope, "
      "Tensor(a!) fast_k, Tensor(b!) fast_v, Tensor temperature, Tensor top_p, Tensor penalty, "
      "Tensor? windows, Tensor noise, int n_q, int n_kv, int dh, float eps) -> Tensor",
      &codebook_pass);
}
