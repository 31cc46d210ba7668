// streamtts_fused::row_linear: a decode step's few bf16 rows times a weight in the pairs layout.
//
// A decode step multiplies 1..B rows by each weight once, so the product is a read of the
// weight; oneDNN's bf16 kernel read them at 21-28 GB/s of a Zen 4's 34 (2026-12-06). Here each
// task owns 64 outputs and streams their weights as one sequence of 64-byte vectors, each fed to
// AVX512-BF16's pairwise dot product (vdpbf16ps) for every row; sums are kept in fp32 and rounded
// once, with the bias, to bf16. Its sums run in another order than oneDNN's, so an output can
// differ from F.linear's by a bf16 step; every caller of a weight in this layout (the Python
// layer and the fused ops alike) runs this kernel, so they agree bit for bit.
//
// Layout (pack_pairs in streamtts/models/fish/fused/pairs.py): a weight [N, K], K even, is held
// as [N/64, K/2, 64, 2]: for task t and input pair j, the pairs (w[n, 2j], w[n, 2j+1]) of the
// task's 64 outputs n, 256 contiguous bytes. A head's N is padded to whole tasks with zero rows;
// its callers drop the padding's outputs.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "row_tiles.h"

namespace {

using at::Tensor;

#if defined(__x86_64__)
using streamtts_fused::kMaxRowsPerTile;
using streamtts_fused::kStreamedTiles;
using streamtts_fused::kTiles;
using streamtts_fused::TileFn;
#endif

bool supported() { return streamtts_fused::avx512_bf16(); }

// x [..., K] bf16, packed [N/64, K/2, 64, 2] bf16, bias [N] or none, residual [..., N] bf16 or
// none -> [..., N] bf16: x times the weight, plus the bias, then plus the residual.
Tensor product(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
               const std::optional<Tensor>& residual) {
  TORCH_CHECK(supported(), "row_linear: this CPU has no AVX512-BF16");
#if defined(__x86_64__)
  const streamtts_fused::RowProduct operands(x, packed, bias, residual);
  const TileFn* tiles = operands.m <= kMaxRowsPerTile ? kStreamedTiles : kTiles;
  // One task per 64 outputs; its weights (64 x K x 2 bytes, 128 KB at K = 1024) stay in the
  // core's L2 while it takes every tile of rows, so memory reads each weight once.
  at::parallel_for(0, operands.tasks, 1, [&](int64_t first_task, int64_t end_task) {
    for (int64_t t = first_task; t < end_task; ++t) operands.run(tiles, t);
  });
  return operands.output();
#else
  return Tensor();
#endif
}

Tensor row_linear(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias) {
  return product(x, packed, bias, std::nullopt);
}

// residual + row_linear(x, packed, bias), the sum rounded as at::add rounds it: the fused ops'
// residual connections in the product's epilogue instead of an add kernel after it.
Tensor row_linear_add(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                      const Tensor& residual) {
  return product(x, packed, bias, residual);
}

}  // namespace

// A CPU kernel, not a catch-all: torch.compile traces PairedLinear through the op's fake
// (registered by pairs.py) instead of decomposing it.
TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def("row_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.def("row_linear_add(Tensor x, Tensor packed, Tensor? bias, Tensor residual) -> Tensor");
  m.def("row_linear_supported() -> bool", &supported);
}

TORCH_LIBRARY_IMPL(streamtts_fused, CPU, m) {
  m.impl("row_linear", &row_linear);
  m.impl("row_linear_add", &row_linear_add);
}
