// streamtts_fused::row_conv: the bf16 vocoder's stride-1 convolutions over time-major rows.
//
// The Firefly decoder's HiFi-GAN stages convolve 16 to 512 channels with kernels of 3 to 13
// taps over a chunk's few hundred to few thousand columns. oneDNN's packed kernel took 100-750 µs
// a call at a first chunk's sizes on the 2-core Zen 4 (2026-12-07), 40-300 GFLOP/s, so a first
// frame cost ~20 ms in them. Here an output is a sum over taps k and input pairs j of AVX512-BF16
// pairwise dot products (vdpbf16ps) of the weights w[o, 2j..2j+1, k] with the inputs
// x[t + k·d, 2j..2j+1], kept in fp32: a tile of R time steps by NB blocks of 16 outputs keeps its
// R·NB sums in registers while the taps and pairs stream by.
//
// Roundings are the plain module's (CausalConv1d without packing: F.conv1d in bf16, then F.silu,
// then the residual sum): the sum plus the bias rounded to bf16; SiLU of that, rounded; plus the
// residual, rounded. Each output's sum runs in one fixed order, whatever the number of columns,
// so a stream decoded chunk by chunk gets the bits it gets decoded at once.
//
// Layout (streamtts/models/fish/codec/blocks.py, pack_conv_pairs): a weight [Cout, Cin, K] as
// [Cout/16, K, Cin/2, 16, 2]: for output block ob, tap k and input pair j, the 16 outputs'
// (w[o, 2j, k], w[o, 2j+1, k]), 64 contiguous bytes.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "bf16x16.h"

namespace {

using at::Tensor;

constexpr int64_t kLanes = 16;      // outputs per block: fp32 sums in one 512-bit register
// Time steps a tile takes, by blocks of outputs (NB): its R x NB sums stay in registers, with
// NB weights and a broadcast input (32 registers in all). Measured on the Zen 4 (2026-12-07):
// 4 blocks by 6 rows ran the 128- and 256-channel layers at 420-440 GFLOP/s (4 by 4: 270-420);
// one block by 24 rows ran the 16-channel ones slower than by 16.
template <int NB>
constexpr int kRows = NB == 4 ? 6 : NB == 2 ? 8 : 16;
constexpr int64_t kWorkItems = 8;   // at least this many (batch, block group, time span) items

#if defined(__x86_64__)

#define STREAMTTS_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// e^x in fp32 to about 2 ulp: x = n ln 2 + r, |r| <= ln2 / 2, e^r by its Taylor polynomial to
// r^7 / 7!, times 2^n by scalef. Saturates past e^±88.
STREAMTTS_BF16 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-88.0f), _mm512_min_ps(_mm512_set1_ps(88.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(1.428606765330187e-06f)));
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  for (const float c :
       {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) {
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
  }
  return _mm512_scalef_ps(p, n);
}

// y rows [R, NB·16 of Cout] from x rows (as int32 bf16 pairs; row t of the tile at
// x + t·x_row, tap k's at + k·d·x_row) and the weights of NB blocks (block b's tap 0, pair 0 at
// w + b·block_stride). Then the epilogue: bias, rounding, SiLU, residual (see the file's head).
template <int R, int NB>
STREAMTTS_BF16 void tile(const int32_t* x, int64_t x_row, const __m512i* w, int64_t block_stride,
                         int64_t taps, int64_t pairs, int64_t dilation, const float* bias,
                         bool silu, const uint16_t* residual, uint16_t* y, int64_t y_row) {
  __m512 acc[R][NB];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < taps; ++k) {
    const int32_t* xk = x + k * dilation * x_row;
    const __m512i* wk = w + k * pairs;
    for (int64_t j = 0; j < pairs; ++j) {
      __m512bh wb[NB];
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) wb[b] = (__m512bh)_mm512_load_si512(wk + b * block_stride + j);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512bh xr = (__m512bh)_mm512_set1_epi32(xk[r * x_row + j]);
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], wb[b], xr);
      }
    }
  }
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    const __m512 bias_b =
        bias != nullptr ? _mm512_loadu_ps(bias + b * kLanes) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m512 v = streamtts_fused::round_bf16x16(_mm512_add_ps(acc[r][b], bias_b));
      if (silu) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), v));  // e^-v
        const __m512 sigmoid_denominator = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
        v = streamtts_fused::round_bf16x16(_mm512_div_ps(v, sigmoid_denominator));
      }
      const int64_t at = r * y_row + b * kLanes;
      const uint16_t* rest = residual != nullptr ? residual + at : nullptr;
      streamtts_fused::store_plus_residual(y + at, v, rest);
    }
  }
}

using TileFn = void (*)(const int32_t*, int64_t, const __m512i*, int64_t, int64_t, int64_t,
                        int64_t, const float*, bool, const uint16_t*, uint16_t*, int64_t);

// tiles<NB>()[r]: the tile of r rows (1 .. 16 / NB).
template <int NB, int... Rows>
constexpr std::array<TileFn, sizeof...(Rows) + 1> tiles_of(std::integer_sequence<int, Rows...>) {
  return {nullptr, tile<Rows + 1, NB>...};
}
template <int NB>
constexpr auto kTiles = tiles_of<NB>(std::make_integer_sequence<int, kRows<NB>>{});

#else  // another architecture: no such kernel, and the vocoder keeps oneDNN's

#endif

// x [B, Tin, Cin] bf16 (time-major rows), packed [Cout/16, K, Cin/2, 16, 2] bf16, bias [Cout]
// (bf16 or fp32: added in fp32) or none, residual [B, Tout, Cout] bf16 or none
// -> [B, Tout, Cout], Tout = Tin - (K - 1)·d.
Tensor row_conv(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                int64_t dilation, bool silu, const std::optional<Tensor>& residual) {
  TORCH_CHECK(streamtts_fused::avx512_bf16(), "row_conv: this CPU has no AVX512-BF16");
#if defined(__x86_64__)
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kBFloat16 &&
                  packed.scalar_type() == at::kBFloat16,
              "row_conv: expected bf16 rows [B, T, C] and a bf16 weight");
  TORCH_CHECK(packed.dim() == 5 && packed.size(3) == kLanes && packed.size(4) == 2 &&
                  packed.is_contiguous(),
              "row_conv: the weight is not in the conv pairs layout");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % 64 == 0,
              "row_conv: the weight is not 64-byte aligned");
  const int64_t blocks = packed.size(0), taps = packed.size(1), pairs = packed.size(2);
  const int64_t c_out = blocks * kLanes, c_in = 2 * pairs;
  TORCH_CHECK(x.size(2) == c_in, "row_conv: rows of ", x.size(2), " channels for a weight of ",
              c_in);
  TORCH_CHECK(dilation >= 1, "row_conv: dilation must be positive");
  const int64_t batch = x.size(0), t_in = x.size(1), t_out = t_in - (taps - 1) * dilation;
  TORCH_CHECK(t_out >= 0, "row_conv: ", t_in, " columns for a receptive field of ",
              (taps - 1) * dilation + 1);
  const Tensor rows = x.contiguous();
  Tensor y = at::empty({batch, t_out, c_out}, x.options());
  Tensor residual_rows;
  if (residual.has_value()) {
    TORCH_CHECK(residual->scalar_type() == at::kBFloat16 && residual->sizes() == y.sizes(),
                "row_conv: the residual must be bf16 [B, Tout, Cout]");
    residual_rows = residual->contiguous();
  }
  Tensor bias32;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == c_out, "row_conv: a bias of ", bias->numel(), " for ", c_out,
                " outputs");
    bias32 = bias->to(at::kFloat).contiguous();
  }
  if (t_out == 0 || batch == 0) return y;
  const int nb = c_out % (4 * kLanes) == 0 ? 4 : c_out % (2 * kLanes) == 0 ? 2 : 1;
  const int max_rows = nb == 4 ? kRows<4> : nb == 2 ? kRows<2> : kRows<1>;
  const TileFn* tiles = nb == 4 ? kTiles<4>.data() : nb == 2 ? kTiles<2>.data() : kTiles<1>.data();
  const int64_t groups = blocks / nb, row_tiles = (t_out + max_rows - 1) / max_rows;
  // Time spans enough for kWorkItems items: a group's weights stay in the core's cache while
  // it takes a span's tiles.
  const int64_t spans = std::min(row_tiles, std::max<int64_t>(1, kWorkItems / (batch * groups)));
  const int64_t tiles_per_span = (row_tiles + spans - 1) / spans;
  const auto* xs = reinterpret_cast<const int32_t*>(rows.data_ptr());
  const auto* ws = reinterpret_cast<const __m512i*>(packed.data_ptr());
  const float* bs = bias32.defined() ? bias32.data_ptr<float>() : nullptr;
  const auto* rs = residual_rows.defined()
                       ? reinterpret_cast<const uint16_t*>(residual_rows.data_ptr())
                       : nullptr;
  auto* ys = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int64_t block_stride = taps * pairs;  // vectors
  at::parallel_for(0, batch * groups * spans, 1, [&](int64_t first, int64_t end) {
    for (int64_t item = first; item < end; ++item) {
      const int64_t b = item / (groups * spans), g = item / spans % groups, s = item % spans;
      const int64_t first_output = g * nb * kLanes;
      const int64_t t_end = std::min(t_out, (s + 1) * tiles_per_span * max_rows);
      for (int64_t t = s * tiles_per_span * max_rows; t < t_end; t += max_rows) {
        const int rows_here = static_cast<int>(std::min<int64_t>(max_rows, t_end - t));
        const int64_t y_offset = (b * t_out + t) * c_out + first_output;
        tiles[rows_here](xs + (b * t_in + t) * pairs, pairs, ws + g * nb * block_stride,
                         block_stride, taps, pairs, dilation,
                         bs != nullptr ? bs + first_output : nullptr, silu,
                         rs != nullptr ? rs + y_offset : nullptr, ys + y_offset, c_out);
      }
    }
  });
  return y;
#else
  return Tensor();
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def(
      "row_conv(Tensor x, Tensor packed, Tensor? bias, int dilation, bool silu, "
      "Tensor? residual) -> Tensor");
}

TORCH_LIBRARY_IMPL(streamtts_fused, CPU, m) { m.impl("row_conv", &row_conv); }
