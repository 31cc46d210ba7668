// streamtts_fused::sample_tokens: sampling.sample for 16-bit logits as one op (CPU).
//
// The Python draw is ~20 ATen calls a row set (the repetition penalty's gather/where/scatter,
// the top-p filter, the temperature, a softmax, the race against the noise, an argmax); the
// fused codebook pass made them 7 times a frame. Here everything elementwise is a plain loop
// with the Python kernels' roundings (fp32 arithmetic, each result rounded to nearest even as
// .to(dtype) rounds), the descending values come from a radix sort of their bit patterns
// (ranks.h), and the three calls whose summation order is the library's own — the softmax of
// the sorted values, its cumulated sum, the softmax of the filtered logits — are the same ATen
// calls on the same values. So the drawn ids are those of the Python draw with the counting
// filter (of several equal logits straddling the cut, the lowest ids stay), for any vocabulary
// (tests/models/fish/fused/test_sample.py). sampling.sample and the codebook pass draw a
// codebook's 1024 ids with it (7 a frame: 49 -> 13 us each on the dev CPU); the slow token's
// 102 048 keep their ATen calls, whose kernels share a row between threads.
// Shapes: B rows, V vocabulary, W window.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "nucleus.h"
#include "ranks.h"

namespace {

using at::Tensor;
using streamtts_fused::descending_rank;
using streamtts_fused::pattern_of_rank;

constexpr float kMinTemperature = 1e-5f;  // sampling.MIN_TEMPERATURE

// The ranks [V] sorted ascending (the values descending), by two counting passes over a byte.
void sort_ranks(const uint16_t* ranks, uint16_t* scratch, uint16_t* sorted, int64_t v) {
  std::array<int64_t, 257> low{}, high{};
  for (int64_t i = 0; i < v; ++i) {
    ++low[(ranks[i] & 0xFF) + 1];
    ++high[(ranks[i] >> 8) + 1];
  }
  for (size_t i = 1; i < 257; ++i) {
    low[i] += low[i - 1];
    high[i] += high[i - 1];
  }
  for (int64_t i = 0; i < v; ++i) scratch[low[ranks[i] & 0xFF]++] = ranks[i];
  for (int64_t i = 0; i < v; ++i) sorted[high[scratch[i] >> 8]++] = scratch[i];
}

template <typename scalar_t>
uint16_t bits_of(scalar_t value) {
  return value.x;
}

template <typename scalar_t>
scalar_t from_bits(uint16_t bits) {
  return scalar_t(bits, scalar_t::from_bits());
}

// logits [B, V] bf16 or fp16; temperature, top_p, penalty [B] float32; window [B, W] ids or
// None; noise [B, V] Exponential(1) draws in the logits dtype (last dim contiguous) -> [B] int64.
Tensor sample_tokens(const Tensor& logits, const Tensor& temperature, const Tensor& top_p,
                     const Tensor& penalty, const std::optional<Tensor>& window,
                     const Tensor& noise) {
  TORCH_CHECK(logits.dim() == 2, "sample_tokens: logits must be [B, V]");
  const auto dtype = logits.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf,
              "sample_tokens: expected bf16 or fp16 logits");
  const int64_t b = logits.size(0), v = logits.size(1);
  TORCH_CHECK(v > 0, "sample_tokens: an empty vocabulary");
  for (const Tensor* column : {&temperature, &top_p, &penalty}) {
    TORCH_CHECK(column->dim() == 1 && column->size(0) == b && column->scalar_type() == at::kFloat,
                "sample_tokens: temperature, top_p and penalty must be [B] float32");
  }
  TORCH_CHECK(noise.dim() == 2 && noise.size(0) == b && noise.size(1) == v &&
                  noise.scalar_type() == dtype && noise.stride(1) == 1,
              "sample_tokens: noise must be [B, V] in the logits dtype, rows contiguous");
  Tensor ids;  // [B, W] int64
  if (window.has_value()) {
    TORCH_CHECK(window->dim() == 2 && window->size(0) == b,
                "sample_tokens: window must be [B, W]");
    ids = window->to(at::kLong).contiguous();
  }
  const Tensor tau = temperature.contiguous(), p = top_p.contiguous(), r = penalty.contiguous();
  const Tensor original = logits.contiguous();
  Tensor penalised = at::empty({b, v}, logits.options());     // [B, V]
  Tensor sorted_values = at::empty({b, v}, logits.options());  // [B, V] descending
  Tensor filtered = at::empty({b, v}, logits.options());      // [B, V] tempered, -inf outside
  Tensor drawn = at::empty({b}, logits.options().dtype(at::kLong));
  std::vector<uint16_t> ranks(static_cast<size_t>(b * v));   // [B, V] by id
  std::vector<uint16_t> sorted(static_cast<size_t>(b * v));  // [B, V] ascending
  AT_DISPATCH_REDUCED_FLOATING_TYPES(dtype, "sample_tokens", [&] {
    const scalar_t* in = original.const_data_ptr<scalar_t>();
    scalar_t* rows = penalised.mutable_data_ptr<scalar_t>();
    std::memcpy(rows, in, static_cast<size_t>(b * v) * sizeof(scalar_t));
    // apply_repetition_penalty: each window id's logit x r below 0, / r otherwise, in fp32,
    // from the logits as they came (a repeated id is penalised once).
    if (ids.defined()) {
      const int64_t w = ids.size(1);
      const int64_t* window_ids = ids.const_data_ptr<int64_t>();
      const float* factors = r.const_data_ptr<float>();
      for (int64_t row = 0; row < b; ++row) {
        for (int64_t j = 0; j < w; ++j) {
          const int64_t token = window_ids[row * w + j];
          TORCH_CHECK(token >= 0 && token < v, "sample_tokens: window ids must be in [0, V)");
          const int64_t id = row * v + token;
          const float score = static_cast<float>(in[id]);
          rows[id] = static_cast<scalar_t>(score < 0 ? score * factors[row] : score / factors[row]);
        }
      }
    }
    // The values in descending order (top_p_filter_by_counting's sorted_logits).
    scalar_t* descending = sorted_values.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, b, 1, [&](int64_t first, int64_t end) {
      std::vector<uint16_t> scratch(static_cast<size_t>(v));
      for (int64_t row = first; row < end; ++row) {
        uint16_t* rank = ranks.data() + row * v;
        uint16_t* order = sorted.data() + row * v;
        for (int64_t i = 0; i < v; ++i) {
          rank[i] = static_cast<uint16_t>(descending_rank(bits_of(rows[row * v + i])));
        }
        sort_ranks(rank, scratch.data(), order, v);
        for (int64_t i = 0; i < v; ++i) {
          descending[row * v + i] = from_bits<scalar_t>(pattern_of_rank(order[i]));
        }
      }
    });
    // sampling._past_nucleus: the same calls on the same values as the Python filter.
    const Tensor cum_probs = at::cumsum(at::softmax(sorted_values, -1), -1);  // [B, V]
    const scalar_t* cum = cum_probs.const_data_ptr<scalar_t>();
    const float* top_p_rows = p.const_data_ptr<float>();
    const float* tau_rows = tau.const_data_ptr<float>();
    scalar_t* out = filtered.mutable_data_ptr<scalar_t>();
    const auto minus_infinity = static_cast<scalar_t>(-std::numeric_limits<float>::infinity());
    at::parallel_for(0, b, 1, [&](int64_t first, int64_t end) {
      for (int64_t row = first; row < end; ++row) {
        // _kept_count: every position past the cut but the first is removed.
        // top_p.to(dtype): the cut compares with it in that dtype.
        const auto cut = static_cast<float>(static_cast<scalar_t>(top_p_rows[row]));
        const scalar_t* row_cum = cum + row * v;
        const int64_t kept = streamtts_fused::kept_count(row_cum, v, cut);
        // _keep_through_cut: every value ranked above the last kept one, and of those equal
        // to it the lowest ids; then apply_temperature on what stays.
        const uint16_t* order = sorted.data() + row * v;
        const uint16_t cut_rank = order[kept - 1];
        int64_t room = kept - (std::lower_bound(order, order + v, cut_rank) - order);
        const uint16_t* rank = ranks.data() + row * v;
        const float clamped = std::max(tau_rows[row], kMinTemperature);  // apply_temperature
        for (int64_t i = 0; i < v; ++i) {
          const bool keep = rank[i] < cut_rank || (rank[i] == cut_rank && room-- > 0);
          out[row * v + i] =
              keep ? static_cast<scalar_t>(static_cast<float>(rows[row * v + i]) / clamped)
                   : minus_infinity;
        }
      }
    });
    // exponential_race: argmax of probs / noise, divided in fp32 and rounded to the dtype,
    // the first of equal maxima (a NaN wins, as in argmax).
    const Tensor probs = at::softmax(filtered, -1);  // [B, V]
    const scalar_t* prob = probs.const_data_ptr<scalar_t>();
    const scalar_t* draws = noise.const_data_ptr<scalar_t>();
    const int64_t noise_stride = noise.stride(0);
    int64_t* winners = drawn.mutable_data_ptr<int64_t>();
    for (int64_t row = 0; row < b; ++row) {
      const scalar_t* row_probs = prob + row * v;
      const scalar_t* row_draws = draws + row * noise_stride;
      int64_t best = 0;
      float best_value = 0;
      for (int64_t i = 0; i < v; ++i) {
        const auto probability = static_cast<float>(row_probs[i]);
        const auto draw = static_cast<float>(row_draws[i]);
        // Most tokens lie outside the nucleus: 0 / a positive draw is 0, which cannot beat a
        // maximum of at least 0 (the first quotient's sign decides; draws are not negative).
        if (i > 0 && probability == 0 && draw > 0 && best_value >= 0) continue;
        const float q = static_cast<scalar_t>(probability / draw);
        if (std::isnan(q)) {
          best = i;
          break;
        }
        if (i == 0 || q > best_value) {
          best = i;
          best_value = q;
        }
      }
      winners[row] = best;
    }
  });
  return drawn;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def(
      "sample_tokens(Tensor logits, Tensor temperature, Tensor top_p, Tensor penalty, "
      "Tensor? window, Tensor noise) -> Tensor");
}

TORCH_LIBRARY_IMPL(streamtts_fused, CPU, m) {
  m.impl("sample_tokens", &sample_tokens);
}
