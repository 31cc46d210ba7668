// streamtts_fused::top_p_by_counting: sampling.top_p_filter_by_counting as one op (CPU).
//
// The Python filter ranks each 16-bit logit by its bit pattern, histograms the ranks, expands
// the histogram into the row's values in descending order, cumulates their softmax to find how
// many tokens upstream's cut keeps, and keeps that many: ~25 ATen calls a row, 1.1 ms for the
// slow token's 102 048 logits on the dev CPU. Here the ranks, the histogram, the expansion and
// the keeping are plain loops; the softmax and the cumulated sum are the same ATen calls on the
// same values, so the kept count and every result bit are the Python filter's (tested).
// Shapes: B rows, V vocabulary, P = 65536 bit patterns.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "nucleus.h"
#include "ranks.h"

namespace {

using at::Tensor;
using streamtts_fused::descending_rank;
using streamtts_fused::kPatterns;
using streamtts_fused::pattern_of_rank;

// logits [B, V] bf16 or fp16, top_p [B] float32 -> [B, V]: the logits outside each row's
// nucleus set to -inf (sampling.top_p_filter_by_counting).
Tensor top_p_by_counting(const Tensor& logits, const Tensor& top_p) {
  TORCH_CHECK(logits.dim() == 2, "top_p_by_counting: logits must be [B, V]");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kHalf,
              "top_p_by_counting: expected bf16 or fp16 logits");
  const int64_t b = logits.size(0), v = logits.size(1);
  TORCH_CHECK(top_p.dim() == 1 && top_p.size(0) == b, "top_p_by_counting: top_p must be [B]");
  const Tensor rows = logits.contiguous();
  const auto* in = reinterpret_cast<const uint16_t*>(rows.data_ptr());
  std::vector<int32_t> counts(static_cast<size_t>(b * kPatterns), 0);  // [B, P]
  Tensor sorted_values = at::empty({b, v}, logits.options());           // [B, V] descending
  auto* sorted_bits = reinterpret_cast<uint16_t*>(sorted_values.data_ptr());
  at::parallel_for(0, b, 1, [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) {
      int32_t* count = counts.data() + r * kPatterns;
      const uint16_t* row = in + r * v;
      for (int64_t i = 0; i < v; ++i) ++count[descending_rank(row[i])];
      uint16_t* out = sorted_bits + r * v;
      for (int64_t rank = 0; rank < kPatterns; ++rank) {
        const uint16_t bits = pattern_of_rank(rank);
        for (int32_t c = 0; c < count[rank]; ++c) *out++ = bits;
      }
    }
  });
  // sampling._past_nucleus: the same calls on the same values as the Python filter.
  const Tensor cum_probs = at::cumsum(at::softmax(sorted_values, -1), -1);  // [B, V]
  const Tensor p = top_p.to(logits.scalar_type()).to(at::kFloat).contiguous();  // [B]
  const float* p_rows = p.data_ptr<float>();
  // _kept_count: every position past the cut but the first is removed.
  std::vector<int64_t> kept(static_cast<size_t>(b));
  AT_DISPATCH_REDUCED_FLOATING_TYPES(cum_probs.scalar_type(), "top_p_by_counting", [&] {
    const scalar_t* cum = cum_probs.const_data_ptr<scalar_t>();
    at::parallel_for(0, b, 1, [&](int64_t first, int64_t end) {
      for (int64_t r = first; r < end; ++r) {
        kept[r] = streamtts_fused::kept_count(cum + r * v, v, p_rows[r]);
      }
    });
  });
  Tensor filtered = at::empty({b, v}, logits.options());
  auto* out_bits = reinterpret_cast<uint16_t*>(filtered.data_ptr());
  uint16_t minus_infinity;
  const Tensor fill = at::full({1}, -std::numeric_limits<double>::infinity(), logits.options());
  std::memcpy(&minus_infinity, fill.data_ptr(), sizeof(minus_infinity));
  at::parallel_for(0, b, 1, [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) {
      // The rank of the last kept value, and how many values rank above it.
      const int32_t* count = counts.data() + r * kPatterns;
      int64_t cut_rank = 0, above = 0;
      while (above + count[cut_rank] < kept[r]) above += count[cut_rank++];
      int64_t room = kept[r] - above;  // of the values at the cut, the lowest ids stay
      const uint16_t* row = in + r * v;
      uint16_t* out = out_bits + r * v;
      for (int64_t i = 0; i < v; ++i) {
        const int32_t rank = descending_rank(row[i]);
        const bool keep = rank < cut_rank || (rank == cut_rank && room-- > 0);
        out[i] = keep ? row[i] : minus_infinity;
      }
    }
  });
  return filtered;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def("top_p_by_counting(Tensor logits, Tensor top_p) -> Tensor");
}

TORCH_LIBRARY_IMPL(streamtts_fused, CPU, m) {
  m.impl("top_p_by_counting", &top_p_by_counting);
}
