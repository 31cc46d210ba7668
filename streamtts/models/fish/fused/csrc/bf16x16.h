// Sixteen bf16 values at a time, rounded exactly as c10::BFloat16 rounds: the elementwise loops
// of packed_ops.h in 512-bit registers, with the scalar code's bits.
//
// Widening a bf16 is exact (its pattern in the upper half of an fp32). Rounding an fp32 is
// c10's round_to_nearest_even done on integers: add 0x7fff plus the kept part's lowest bit, keep
// the upper half; a NaN becomes 0x7fc0. Not VCVTNEPS2BF16, which treats denormal inputs as zero
// and keeps a NaN's sign and payload. Products and sums are single fp32 operations, rounded as
// the scalar code's (no fused multiply-add: the build's -ffp-contract=off, and none written).
// Callers use these only where avx512_bw() says the CPU has the instructions; avx512_bf16() is
// the check for the library's kernels that also multiply pairs of bf16 (vdpbf16ps).
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace streamtts_fused {

#if defined(__x86_64__)

inline bool avx512_bw() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return supported;
}

// AVX-512 with the bf16 pairwise dot product (vdpbf16ps): row_linear's and row_conv's kernels.
inline bool avx512_bf16() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return avx512_bw() && __builtin_cpu_supports("avx512bf16");
  }();
  return supported;
}

#define STREAMTTS_AVX512 __attribute__((target("avx512f,avx512bw")))

// 16 bf16 patterns -> 16 fp32 values.
STREAMTTS_AVX512 inline __m512 load_bf16x16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// 16 fp32 values -> their bf16 patterns (in the low half of each lane), rounded to nearest
// even as c10::BFloat16 rounds.
STREAMTTS_AVX512 inline __m512i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lowest_kept = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lowest_kept, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, rounded, _mm512_set1_epi32(0x7fc0));
}

// 16 fp32 values rounded to bf16, at p.
STREAMTTS_AVX512 inline void store_bf16x16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(v)));
}

// 16 fp32 values rounded to bf16 and widened again (a .to(bf16) then a .float()).
STREAMTTS_AVX512 inline __m512 round_bf16x16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16));
}

// A kernel's epilogue for 16 outputs v (bf16 values, widened): plus the 16 bf16 at `residual`
// where given, summed as ATen adds two bf16 tensors (both widened, one fp32 sum, rounded),
// then stored at y.
STREAMTTS_AVX512 inline void store_plus_residual(uint16_t* y, __m512 v, const uint16_t* residual) {
  if (residual != nullptr) v = _mm512_add_ps(load_bf16x16(residual), v);
  store_bf16x16(y, v);
}

#else

inline bool avx512_bw() { return false; }
inline bool avx512_bf16() { return false; }

#endif

}  // namespace streamtts_fused
