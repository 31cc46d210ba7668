// What both fused ops share: oneDNN's linear on packed weights, RMSNorm, the layer layout.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <type_traits>

#include "bf16x16.h"

namespace streamtts_fused {

using at::Tensor;

constexpr int64_t kTensorsPerLayer = 4;  // wqkv, wo, w13, w2 (packed)
constexpr int64_t kNormsPerLayer = 2;    // attention_norm, ffn_norm
// Rows of the elementwise loops below per thread: a decode step's few rows stay on the calling
// thread; a prompt's (prefill) are split between the threads.
constexpr int64_t kRowsPerThread = 16;

// row_linear.cpp's op: bf16 rows times a weight in the pairs layout (PairedLinear.forward).
// Called through the dispatcher, as oneDNN's is, so the profiler sees each product.
inline Tensor row_linear(const Tensor& x, const Tensor& packed,
                         const std::optional<Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("streamtts_fused::row_linear", "")
                             .typed<Tensor(const Tensor&, const Tensor&,
                                           const std::optional<Tensor>&)>();
  return op.call(x, packed, bias);
}

// sample.cpp's op: one id per row of 16-bit logits (sampling.sample), as the Python pass draws.
inline Tensor sample_tokens(const Tensor& logits, const Tensor& temperature, const Tensor& top_p,
                            const Tensor& penalty, const std::optional<Tensor>& window,
                            const Tensor& noise) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("streamtts_fused::sample_tokens", "")
                             .typed<Tensor(const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, const std::optional<Tensor>&,
                                           const Tensor&)>();
  return op.call(logits, temperature, top_p, penalty, window, noise);
}

// row_linear.cpp's residual + row_linear(x, packed, bias), rounded as at::add rounds the sum.
inline Tensor row_linear_add(const Tensor& x, const Tensor& packed,
                             const std::optional<Tensor>& bias, const Tensor& residual) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("streamtts_fused::row_linear_add", "")
                             .typed<Tensor(const Tensor&, const Tensor&,
                                           const std::optional<Tensor>&, const Tensor&)>();
  return op.call(x, packed, bias, residual);
}

// attention.cpp's op: the codebook pass's attention at one position where the layers are paired.
inline Tensor position_attention(const Tensor& q, const Tensor& keys, const Tensor& values,
                                 int64_t pos, double scale) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("streamtts_fused::position_attention", "")
          .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, double)>();
  return op.call(q, keys, values, pos, scale);
}

// A packed layer's product, [..., in] -> [..., out] (PackedLinear.forward): row_linear for a
// weight in the pairs layout (a plain tensor), else oneDNN's linear on a weight packed by
// mkldnn::_reorder_linear_weight (an MkldnnCPU tensor).
inline Tensor packed_linear(const Tensor& x, const Tensor& packed,
                            const std::optional<Tensor>& bias) {
  if (!packed.is_mkldnn()) return row_linear(x, packed, bias);
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                        c10::string_view, c10::List<std::optional<c10::Scalar>>,
                        std::optional<c10::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<c10::Scalar>>(), std::nullopt);
}

// residual.add(packed_linear(x, packed, bias)): a residual connection, in row_linear's epilogue
// where the weight is in the pairs layout (the same bits: tested against the two calls).
inline Tensor packed_linear_add(const Tensor& x, const Tensor& packed,
                                const std::optional<Tensor>& bias, const Tensor& residual) {
  if (!packed.is_mkldnn() && residual.scalar_type() == at::kBFloat16) {
    return row_linear_add(x, packed, bias, residual);
  }
  return residual.add(packed_linear(x, packed, bias));
}

// A head's logits [..., width]: a paired head's product has its last task's padding beyond
// `width` (pairs.py), dropped as PairedLinear.forward drops it.
inline Tensor head_outputs(const Tensor& y, int64_t width) {
  return y.size(-1) == width ? y : y.narrow(-1, 0, width).contiguous();
}

// The bf16 loops below, 16 values at a time where the CPU has AVX-512 (bf16x16.h): each
// returns where it stopped, the scalar loop doing the rest. The same operations and roundings.
#if defined(__x86_64__)
inline const uint16_t* bits(const at::BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* bits(at::BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }

// y[j] = x[j]·cos[j] + x[j^1]·sin[j], rounded, for j < dh in steps of 16 (pairs stay in a step).
STREAMTTS_AVX512 inline int64_t rotate_bf16(const at::BFloat16* x, const float* cos,
                                            const float* sin, at::BFloat16* y, int64_t dh) {
  int64_t j = 0;
  for (; j + 16 <= dh; j += 16) {
    const __m512 v = load_bf16x16(bits(x + j));
    const __m512 swapped = _mm512_permute_ps(v, 0xb1);  // (x1, x0, x3, x2, ...)
    const __m512 product = _mm512_mul_ps(v, _mm512_loadu_ps(cos + j));
    const __m512 swapped_product = _mm512_mul_ps(swapped, _mm512_loadu_ps(sin + j));
    store_bf16x16(bits(y + j), _mm512_add_ps(product, swapped_product));
  }
  return j;
}

// squares[i] = x[i]², from i = first towards end.
STREAMTTS_AVX512 inline int64_t squares_bf16(const at::BFloat16* x, float* squares, int64_t first,
                                             int64_t end) {
  int64_t i = first;
  for (; i + 16 <= end; i += 16) {
    const __m512 v = load_bf16x16(bits(x + i));
    _mm512_storeu_ps(squares + i, _mm512_mul_ps(v, v));
  }
  return i;
}

// y[i] = bf16(bf16(x[i]·inverse)·w[i]) for i < d.
STREAMTTS_AVX512 inline int64_t normalize_bf16(const at::BFloat16* x, const at::BFloat16* w,
                                               at::BFloat16* y, int64_t d, float inverse) {
  const __m512 scale = _mm512_set1_ps(inverse);
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    const __m512 normed = round_bf16x16(_mm512_mul_ps(load_bf16x16(bits(x + i)), scale));
    store_bf16x16(bits(y + i), _mm512_mul_ps(normed, load_bf16x16(bits(w + i))));
  }
  return i;
}
#else
inline int64_t rotate_bf16(const at::BFloat16*, const float*, const float*, at::BFloat16*,
                           int64_t) { return 0; }
inline int64_t squares_bf16(const at::BFloat16*, float*, int64_t first, int64_t) { return first; }
inline int64_t normalize_bf16(const at::BFloat16*, const at::BFloat16*, at::BFloat16*, int64_t,
                              float) { return 0; }
#endif

// The vector loops for bf16; other dtypes do every value in the scalar loops.
template <typename T>
int64_t rotate_vec(const T* x, const float* cos, const float* sin, T* y, int64_t dh) {
  if constexpr (std::is_same_v<T, at::BFloat16>) return rotate_bf16(x, cos, sin, y, dh);
  return 0;
}
template <typename T>
int64_t squares_vec(const T* x, float* squares, int64_t first, int64_t end) {
  if constexpr (std::is_same_v<T, at::BFloat16>) return squares_bf16(x, squares, first, end);
  return first;
}
template <typename T>
int64_t normalize_vec(const T* x, const T* w, T* y, int64_t d, float inverse) {
  if constexpr (std::is_same_v<T, at::BFloat16>) return normalize_bf16(x, w, y, d, inverse);
  return 0;
}

// rotate_pairs (llama.py) over the first `heads` heads of each row, rounded to the rows' dtype:
// rows [B, >= heads·Dh] (its last dim contiguous), cos and sin [B, Dh] (a row each) or [Dh]
// (one for all), fp32 -> [B, heads, Dh]. Each value is x·cos + swapped·sin with the Python
// kernels' fp32 roundings (x32 * cos + swapped * sin: two products and a sum, each rounded;
// no fused multiply-add, which the build's -ffp-contract=off keeps out), then rounded to
// nearest even as .to(dtype) rounds: the same bits, in one loop instead of six kernels.
inline Tensor rotate_pairs_rounded(const Tensor& rows, int64_t heads, int64_t dh,
                                   const Tensor& cos, const Tensor& sin) {
  TORCH_CHECK(rows.dim() == 2 && rows.stride(1) == 1 && rows.size(1) >= heads * dh && dh % 2 == 0,
              "rotate_pairs_rounded: rows must be [B, >= heads * Dh], Dh even");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.sizes() == cos.sizes() &&
                  cos.size(-1) == dh && (cos.dim() == 1 || cos.size(0) == rows.size(0)),
              "rotate_pairs_rounded: cos and sin must be fp32 [B, Dh] or [Dh]");
  const int64_t b = rows.size(0), row_stride = rows.stride(0);
  const Tensor c = cos.contiguous(), s = sin.contiguous();
  const int64_t trig_stride = c.dim() == 2 ? dh : 0;
  Tensor out = at::empty({b, heads, dh}, rows.options());
  const bool vectors = avx512_bw();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, rows.scalar_type(),
                                  "rotate_pairs_rounded", [&] {
    const scalar_t* x = rows.const_data_ptr<scalar_t>();
    const float* cos_row = c.const_data_ptr<float>();
    const float* sin_row = s.const_data_ptr<float>();
    scalar_t* y = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, b, kRowsPerThread, [&](int64_t first, int64_t end) {
      for (int64_t i = first; i < end; ++i) {
        const float* cos_i = cos_row + i * trig_stride;
        const float* sin_i = sin_row + i * trig_stride;
        for (int64_t h = 0; h < heads; ++h) {
          const scalar_t* head = x + i * row_stride + h * dh;
          scalar_t* y_head = y + (i * heads + h) * dh;
          for (int64_t j = vectors ? rotate_vec(head, cos_i, sin_i, y_head, dh) : 0; j < dh;
               ++j) {
            const float product = static_cast<float>(head[j]) * cos_i[j];
            const float swapped = static_cast<float>(head[j ^ 1]) * sin_i[j];
            y_head[j] = static_cast<scalar_t>(product + swapped);
          }
        }
      }
    });
  });
  return out;
}

// RMSNorm.forward: at::rms_norm(x) (normalised in fp32, rounded once to x's dtype), then times
// the weight in that dtype. at::rms_norm's CPU composite makes ~14 ATen calls a row set (~12 µs
// for a decode step's row); this makes one, at::sum, the only call whose summation order is the
// library's own, and computes the rest with the same fp32 roundings: squares, their sum / D,
// + eps, 1 / sqrt (as ATen's rsqrt), the product rounded to x's dtype, times the weight rounded
// again. The same bits (the fused ops' tests; it was checked against at::rms_norm in bf16, fp16
// and fp32, D of 64 to 4096 and odd ones, 1-17 rows, three scales). Other dtypes: at::rms_norm.
inline Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const auto dtype = x.scalar_type();
  const int64_t d = x.size(-1);
  if ((dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kFloat) ||
      weight.scalar_type() != dtype || weight.numel() != d) {
    return at::rms_norm(x, {d}, std::nullopt, eps).mul(weight);
  }
  const Tensor rows = x.reshape({-1, d}).contiguous();  // [R, D]
  const Tensor w = weight.contiguous();
  const int64_t n = rows.size(0);
  Tensor squares = at::empty({n, d}, rows.options().dtype(at::kFloat));
  Tensor out = at::empty_like(rows);
  const bool vectors = avx512_bw();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "rms_norm", [&] {
    const scalar_t* xs = rows.const_data_ptr<scalar_t>();
    float* sq = squares.mutable_data_ptr<float>();
    at::parallel_for(0, n, kRowsPerThread, [&](int64_t first, int64_t end) {
      for (int64_t i = vectors ? squares_vec(xs, sq, first * d, end * d) : first * d; i < end * d;
           ++i) {
        const float v = static_cast<float>(xs[i]);
        sq[i] = v * v;
      }
    });
    const Tensor sums = at::sum(squares, -1);  // [R]
    const float* s = sums.const_data_ptr<float>();
    const scalar_t* ws = w.const_data_ptr<scalar_t>();
    scalar_t* ys = out.mutable_data_ptr<scalar_t>();
    const float eps32 = static_cast<float>(eps), count = static_cast<float>(d);
    at::parallel_for(0, n, kRowsPerThread, [&](int64_t first, int64_t end) {
      for (int64_t r = first; r < end; ++r) {
        const float inverse = 1.0f / std::sqrt(s[r] / count + eps32);
        const scalar_t* x_row = xs + r * d;
        scalar_t* y_row = ys + r * d;
        for (int64_t i = vectors ? normalize_vec(x_row, ws, y_row, d, inverse) : 0; i < d; ++i) {
          const auto normed = static_cast<scalar_t>(static_cast<float>(x_row[i]) * inverse);
          y_row[i] =
              static_cast<scalar_t>(static_cast<float>(normed) * static_cast<float>(ws[i]));
        }
      }
    });
  });
  return out.view(x.sizes());
}

// A pass's products made one at a time (packed_linear, packed_linear_add); the codebook pass
// may make them through a team instead (product_team.h), with the same bits.
struct EachProduct {
  Tensor linear(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias) const {
    return packed_linear(x, packed, bias);
  }
  Tensor linear_add(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                    const Tensor& residual) const {
    return packed_linear_add(x, packed, bias, residual);
  }
};

// residual + FeedForward (the gate and up projections fused) of its normed input:
// [..., D] -> [..., D].
template <class Products = EachProduct>
Tensor feed_forward_add(const Tensor& normed, const Tensor& w13, const Tensor& w2,
                        const Tensor& residual, const Products& products = {}) {
  Tensor gate_up = products.linear(normed, w13, std::nullopt);
  std::vector<Tensor> halves = gate_up.chunk(2, -1);
  return products.linear_add(at::silu(halves[0]).mul(halves[1]), w2, std::nullopt, residual);
}

// The weight lists of `n_layers` blocks, as the Python side passes them (fused/layers.py).
inline void check_layers(const char* op, at::TensorList norms, at::TensorList packed,
                         int64_t n_layers) {
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == kNormsPerLayer * n_layers, op,
              ": expected ", kNormsPerLayer * n_layers, " norms");
  TORCH_CHECK(static_cast<int64_t>(packed.size()) == kTensorsPerLayer * n_layers, op,
              ": expected ", kTensorsPerLayer * n_layers, " packed weights");
}

}  // namespace streamtts_fused
