// streamtts_fused::position_attention: the codebook pass's attention at one position (CPU).
//
// Attention.decode_position over the fast cache is ~12 ATen calls a layer (a widening copy, two
// batched products over <= 9 keys, roundings, a scale, a softmax): ~17 us where the arithmetic
// is ~1 us. Here it is one loop nest with the same roundings at the same places: the scores
// summed in fp32 and rounded to the rows' dtype, scaled in fp32 and rounded again, the softmax
// in fp32 rounded once, the weighted sum of the values in fp32 rounded once. Its sums and its
// exp run in its own order and precision, so a result can differ from the ATen calls' by a
// step of the dtype; every caller runs this op where the layers are paired (Attention's
// `own_kernel`, set by pair_linears_), so the Python and the fused pass agree bit for bit.
// Shapes: B rows, H query heads, G KV heads, C positions of the cache, Dh head dim.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "bf16x16.h"

namespace {

using at::Tensor;

constexpr int64_t kHeadsPerThread = 32;  // parallel_for's grain: a batch of one stays serial
constexpr int64_t kLanes = 16;           // partial sums of a dot product

#if defined(__x86_64__)
// dot_product's products summed into its lanes, 16 at a time in one register: lane l takes
// elements l, l + kLanes, ... as in the scalar loop (each product rounded, then the sum).
// Returns where it stopped.
STREAMTTS_AVX512 int64_t dot_lanes_avx512(const float* a, const float* b, int64_t n,
                                          float* lanes) {
  __m512 sums = _mm512_loadu_ps(lanes);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    sums = _mm512_add_ps(sums, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  }
  _mm512_storeu_ps(lanes, sums);
  return i;
}

// sums[d] += p · v[d] for d < n in steps of 16 (the product rounded, then the sum); returns
// where it stopped.
STREAMTTS_AVX512 int64_t add_scaled_avx512(float* sums, float p, const float* v, int64_t n) {
  const __m512 scale = _mm512_set1_ps(p);
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    const __m512 product = _mm512_mul_ps(scale, _mm512_loadu_ps(v + d));
    _mm512_storeu_ps(sums + d, _mm512_add_ps(_mm512_loadu_ps(sums + d), product));
  }
  return d;
}

// y[d] = bf16(sums[d]) for d < n in steps of 16, rounded as c10 rounds; returns where it stopped.
STREAMTTS_AVX512 int64_t round_bf16_avx512(const float* sums, at::BFloat16* y, int64_t n) {
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    streamtts_fused::store_bf16x16(reinterpret_cast<uint16_t*>(y + d), _mm512_loadu_ps(sums + d));
  }
  return d;
}
#else
int64_t dot_lanes_avx512(const float*, const float*, int64_t, float*) { return 0; }
int64_t add_scaled_avx512(float*, float, const float*, int64_t) { return 0; }
int64_t round_bf16_avx512(const float*, at::BFloat16*, int64_t) { return 0; }
#endif

// round_bf16_avx512 for bf16; fp16 rounds every value in the scalar loop.
template <typename T>
int64_t round_vec(const float* sums, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, at::BFloat16>) return round_bf16_avx512(sums, y, n);
  return 0;
}

// The dot product of two fp32 rows of `n`: kLanes partial sums (lane l takes elements l,
// l + kLanes, ...), then added pairwise; a fixed order, in vectors where `vectors` or scalar
// code, with the same bits.
inline float dot_product(const float* a, const float* b, int64_t n, bool vectors) {
  float lanes[kLanes] = {};
  int64_t i = vectors ? dot_lanes_avx512(a, b, n, lanes) : 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  for (int64_t l = 0; i < n; ++i, ++l) lanes[l] += a[i] * b[i];
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// q [B, H, Dh] bf16 or fp16 (rotated), keys and values [B, G, C, Dh] fp32 with positions
// 0..pos written -> [B, H·Dh] in q's dtype: each head over the keys of its group (H/G heads a
// group, in order).
Tensor position_attention(const Tensor& q, const Tensor& keys, const Tensor& values, int64_t pos,
                          double scale) {
  TORCH_CHECK(q.dim() == 3 && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf),
              "position_attention: q must be [B, H, Dh] in bf16 or fp16");
  TORCH_CHECK(keys.dim() == 4 && keys.scalar_type() == at::kFloat &&
                  values.sizes() == keys.sizes() && values.scalar_type() == at::kFloat,
              "position_attention: keys and values must be fp32 [B, G, C, Dh]");
  const int64_t b = q.size(0), h = q.size(1), dh = q.size(2), g = keys.size(1);
  TORCH_CHECK(keys.size(0) >= b && keys.size(3) == dh && h % g == 0,
              "position_attention: q's heads and head dim do not fit the cache");
  TORCH_CHECK(pos >= 0 && pos < keys.size(2), "position_attention: position ", pos,
              " outside the cache's ", keys.size(2));
  TORCH_CHECK(keys.stride(3) == 1 && values.strides() == keys.strides(),
              "position_attention: keys and values must be laid out alike, head dim contiguous");
  const Tensor rows = q.contiguous();
  Tensor out = at::empty({b, h * dh}, q.options());
  const int64_t seen = pos + 1, per_group = h / g;
  const float scale32 = static_cast<float>(scale);
  const int64_t step = keys.stride(2);
  const bool vectors = streamtts_fused::avx512_bw();
  AT_DISPATCH_REDUCED_FLOATING_TYPES(q.scalar_type(), "position_attention", [&] {
    const scalar_t* qs = rows.const_data_ptr<scalar_t>();
    scalar_t* ys = out.mutable_data_ptr<scalar_t>();
    const float* key_data = keys.const_data_ptr<float>();
    const float* value_data = values.const_data_ptr<float>();
    // A task is one head of one row; a decode step's single row stays on one thread.
    at::parallel_for(0, b * h, kHeadsPerThread, [&](int64_t first, int64_t end) {
      std::vector<float> query(static_cast<size_t>(dh)), probs(static_cast<size_t>(seen)),
          sums(static_cast<size_t>(dh));
      for (int64_t task = first; task < end; ++task) {
        const int64_t row = task / h, head = task % h, group = head / per_group;
        const int64_t offset = row * keys.stride(0) + group * keys.stride(1);
        const float* k = key_data + offset;  // [C, Dh], rows `step` apart
        const float* v = value_data + offset;
        const scalar_t* qh = qs + task * dh;
        for (int64_t d = 0; d < dh; ++d) query[d] = static_cast<float>(qh[d]);
        float largest = -INFINITY;
        for (int64_t j = 0; j < seen; ++j) {
          const float dot = dot_product(query.data(), k + j * step, dh, vectors);
          // .type_as(x), then .mul_(scale) in the dtype: each rounded.
          const auto score = static_cast<scalar_t>(
              static_cast<float>(static_cast<scalar_t>(dot)) * scale32);
          probs[j] = static_cast<float>(score);
          largest = std::max(largest, probs[j]);
        }
        float total = 0;
        for (int64_t j = 0; j < seen; ++j) {
          probs[j] = std::exp(probs[j] - largest);
          total += probs[j];
        }
        for (int64_t j = 0; j < seen; ++j) {
          probs[j] = static_cast<float>(static_cast<scalar_t>(probs[j] / total));  // softmax's
        }
        std::fill(sums.begin(), sums.end(), 0.0f);
        for (int64_t j = 0; j < seen; ++j) {
          const float p = probs[j];
          const float* vj = v + j * step;
          for (int64_t d = vectors ? add_scaled_avx512(sums.data(), p, vj, dh) : 0; d < dh; ++d) {
            sums[d] += p * vj[d];
          }
        }
        scalar_t* y = ys + task * dh;
        for (int64_t d = vectors ? round_vec(sums.data(), y, dh) : 0; d < dh; ++d) {
          y[d] = static_cast<scalar_t>(sums[d]);
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def(
      "position_attention(Tensor q, Tensor keys, Tensor values, int pos, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(streamtts_fused, CPU, m) {
  m.impl("position_attention", &position_attention);
}
