// 16-bit float patterns ordered by value, largest first (sampling.descending_rank).
#pragma once

#include <cstdint>

namespace streamtts_fused {

constexpr int64_t kPatterns = 65536;  // 16-bit patterns, so ranks

// 0 for the largest value, ordered like the values: a non-negative pattern rises with the value
// and ranks 32767 - bits; a negative one falls with it and ranks its own bits read unsigned.
inline int32_t descending_rank(uint16_t bits) {
  return (bits & 0x8000) != 0 ? static_cast<int32_t>(bits) : 32767 - static_cast<int32_t>(bits);
}

// The pattern whose rank is `rank` (float16_values_descending's table, as bits).
inline uint16_t pattern_of_rank(int64_t rank) {
  return static_cast<uint16_t>(rank >= 32768 ? rank : 32767 - rank);
}

}  // namespace streamtts_fused
