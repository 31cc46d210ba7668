// row_linear's kernel: R bf16 rows times one task's 64 outputs of a weight in the pairs layout
// (row_linear.cpp's comment has the layout), for row_linear and the product team
// (product_team.h) alike, so both compute each output the same way.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "bf16x16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace streamtts_fused {

#if defined(__x86_64__)

using at::Tensor;

constexpr int64_t kLanes = 16;                      // fp32 sums in one 512-bit register
constexpr int64_t kBlocks = 4;                      // registers of outputs per task
constexpr int64_t kOutputsPerTask = kLanes * kBlocks;  // 64
constexpr int kMaxRowsPerTile = 4;                  // 4 rows x 4 blocks = 16 accumulators
// A product of at most kMaxRowsPerTile rows (a decode step) reads each weight once, straight from
// memory: its tiles ask for the weights this many input pairs ahead (32 x 256 B = 8 KB), with the
// non-temporal hint, past where the hardware prefetchers stop (each 4 KiB page's end). On the
// Zen 4 (2026-12-07, the fast layers' 120 MB in turn, batch 1, end to end as arena.py lays them,
// medians of 30 rounds) it read them at 58.4 GB/s against 55.8 without on huge pages (the
// memory summed at 63.8), and at 35.7 against 31.1 on 4 KiB pages (34.6). (Prefetching into
// L1 without the hint measured 0.5-0.8x on 2026-12-06.)
// A prompt's rows reuse each task's weights from L2 for every tile, and take no hint.
constexpr int64_t kPrefetchPairs = 32;

// R rows of x (as int32 bf16 pairs) times one task's weights: y rows [R, 64 of N]; with
// `kStreamed`, the weights are prefetched kPrefetchPairs ahead (a prefetch never faults, so
// reading ahead past the weight's end is harmless). With a `residual` (rows [R, 64 of N], bf16),
// each output is then added to it as ATen adds two bf16 tensors: both widened, summed in fp32,
// rounded to nearest even.
template <int R, bool kStreamed>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void tile(
    const int32_t* x, int64_t x_stride_pairs, const __m512i* w, int64_t pairs,
    const float* bias, const uint16_t* residual, uint16_t* y, int64_t y_stride) {
  // Every loop over rows and blocks is unrolled (-O2 would not), so the R x 4 sums stay in
  // registers: kept on the stack they made each product wait on a store (2x slower at 4 rows).
  __m512 acc[R][kBlocks];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < kBlocks; ++b) acc[r][b] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < pairs; ++j) {
    const __m512i* wj = w + j * kBlocks;
    if constexpr (kStreamed) {
#pragma GCC unroll 4
      for (int b = 0; b < kBlocks; ++b) {
        _mm_prefetch(reinterpret_cast<const char*>(wj + kPrefetchPairs * kBlocks + b),
                     _MM_HINT_NTA);
      }
    }
    __m512bh wb[kBlocks];
#pragma GCC unroll 4
    for (int b = 0; b < kBlocks; ++b) wb[b] = (__m512bh)_mm512_load_si512(wj + b);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m512bh xr = (__m512bh)_mm512_set1_epi32(x[r * x_stride_pairs + j]);
#pragma GCC unroll 4
      for (int b = 0; b < kBlocks; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], wb[b], xr);
    }
  }
#pragma GCC unroll 4
  for (int b = 0; b < kBlocks; ++b) {
    const __m512 bias_b =
        bias != nullptr ? _mm512_loadu_ps(bias + b * kLanes) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      // Rounded as c10 rounds (bf16x16.h), denormals kept: VCVTNEPS2BF16 would flush them.
      const __m512 out = streamtts_fused::round_bf16x16(_mm512_add_ps(acc[r][b], bias_b));
      const int64_t at = r * y_stride + b * kLanes;
      const uint16_t* rest = residual != nullptr ? residual + at : nullptr;
      streamtts_fused::store_plus_residual(y + at, out, rest);
    }
  }
}

using TileFn = void (*)(const int32_t*, int64_t, const __m512i*, int64_t, const float*,
                        const uint16_t*, uint16_t*, int64_t);
constexpr TileFn kTiles[kMaxRowsPerTile + 1] = {nullptr, tile<1, false>, tile<2, false>,
                                                tile<3, false>, tile<4, false>};
constexpr TileFn kStreamedTiles[kMaxRowsPerTile + 1] = {nullptr, tile<1, true>, tile<2, true>,
                                                        tile<3, true>, tile<4, true>};

// A product's operands, checked and laid out as the tiles take them (what row_linear and the
// product team both run): x [..., K] bf16 as rows [M, K]; packed [N/64, K/2, 64, 2] bf16,
// 64-byte aligned; bias [N] in fp32, or none; residual [..., N] bf16 as rows [M, N], or none;
// and the output y [M, N] bf16 that run() writes.
struct RowProduct {
  RowProduct(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
             const std::optional<Tensor>& residual) {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
                "row_linear: expected bf16 rows and weight");
    TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kOutputsPerTask && packed.size(3) == 2 &&
                    packed.is_contiguous(),
                "row_linear: the weight is not in the pairs layout");
    tasks = packed.size(0);
    pairs = packed.size(1);
    out_features = tasks * kOutputsPerTask;
    TORCH_CHECK(x.size(-1) == 2 * pairs, "row_linear: rows of ", x.size(-1), " for a weight of ",
                2 * pairs, " inputs");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % 64 == 0,
                "row_linear: the weight is not 64-byte aligned");
    rows_ = x.reshape({-1, 2 * pairs}).contiguous();
    m = rows_.size(0);
    out_shape.assign(x.sizes().begin(), x.sizes().end());
    out_shape.back() = out_features;
    y_ = at::empty({m, out_features}, x.options());
    if (residual.has_value()) {
      TORCH_CHECK(residual->scalar_type() == at::kBFloat16 && residual->sizes() == out_shape,
                  "row_linear_add: the residual must be bf16 of the output's shape ",
                  c10::IntArrayRef(out_shape));
      residual_ = residual->reshape({m, out_features}).contiguous();
    }
    if (bias.has_value()) {
      TORCH_CHECK(bias->numel() == out_features, "row_linear: a bias of ", bias->numel(),
                  " for ", out_features, " outputs");
      bias_ = bias->to(at::kFloat).contiguous();
    }
    xs_ = reinterpret_cast<const int32_t*>(rows_.const_data_ptr());
    ws_ = reinterpret_cast<const __m512i*>(packed.const_data_ptr());
    bs_ = bias_.defined() ? bias_.const_data_ptr<float>() : nullptr;
    rs_ = residual_.defined() ? reinterpret_cast<const uint16_t*>(residual_.const_data_ptr())
                              : nullptr;
    ys_ = reinterpret_cast<uint16_t*>(y_.mutable_data_ptr());
  }

  // Task t's outputs (its 64 of N) for every row, in tiles of at most kMaxRowsPerTile rows.
  void run(const TileFn* tiles, int64_t t) const {
    const __m512i* wt = ws_ + t * pairs * kBlocks;
    const int64_t first_output = t * kOutputsPerTask;
    for (int64_t r = 0; r < m; r += kMaxRowsPerTile) {
      const int rows_here = static_cast<int>(m - r < kMaxRowsPerTile ? m - r : kMaxRowsPerTile);
      tiles[rows_here](xs_ + r * pairs, pairs, wt, pairs,
                       bs_ != nullptr ? bs_ + first_output : nullptr,
                       rs_ != nullptr ? rs_ + r * out_features + first_output : nullptr,
                       ys_ + r * out_features + first_output, out_features);
    }
  }

  // The output, once every task has run: [..., N].
  Tensor output() const { return y_.view(out_shape); }

  int64_t tasks = 0, pairs = 0, out_features = 0;
  int64_t m = 0;  // rows
  std::vector<int64_t> out_shape;

 private:
  Tensor rows_, y_, residual_, bias_;  // [M, K], [M, N], [M, N] or undefined, [N] fp32 or undefined
  const int32_t* xs_ = nullptr;
  const __m512i* ws_ = nullptr;
  const float* bs_ = nullptr;
  const uint16_t* rs_ = nullptr;
  uint16_t* ys_ = nullptr;
};

#endif  // elsewhere no kernel: avx512_bf16() is false, and no weight is paired

}  // namespace streamtts_fused
