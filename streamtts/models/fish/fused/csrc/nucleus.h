// Where upstream's top-p cut falls in a row's cumulated probabilities (sampling._kept_count).
#pragma once

#include <algorithm>
#include <cstdint>

namespace streamtts_fused {

// How many tokens the cut keeps: every position past the first whose cumulated probability
// exceeds `cut` is removed. `cum` [V] is the cumulated softmax of the values in descending
// order: sums of non-negative terms, rounded monotonically, so it never decreases and the
// positions past the cut are a suffix, found by bisection instead of a pass over the row. A
// NaN or infinite logit makes the softmax NaN throughout (its maximum or its sum is NaN), so
// no position exceeds the cut and all are kept, as the Python filter's comparisons find.
template <typename scalar_t>
int64_t kept_count(const scalar_t* cum, int64_t v, float cut) {
  const scalar_t* first_past = std::partition_point(
      cum + std::min<int64_t>(1, v), cum + v,
      [cut](scalar_t value) { return !(static_cast<float>(value) > cut); });
  return first_past - cum;  // >= 1
}

}  // namespace streamtts_fused
