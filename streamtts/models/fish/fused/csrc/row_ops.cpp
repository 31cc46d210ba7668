// packed_ops.h's elementwise row ops as ops of their own: streamtts_fused::rms_norm and
// streamtts_fused::rotate_pairs_rounded. The fused ops call the inline functions directly; these
// let tests hold them to the Python kernels' bits on any input (NaN, infinities, denormals,
// lengths no multiple of a vector, rows enough to be split between threads). And the product
// team (product_team.h), which the fused ops make their products with, as ops that let tests
// hold it to row_linear's bits and see where it applies.

#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "packed_ops.h"
#include "product_team.h"

namespace {

using at::Tensor;

// Whether a team makes the products of these weights for `rows` rows here.
bool product_team_applies(at::TensorList packed, int64_t rows) {
#if defined(__x86_64__) && defined(_OPENMP)
  return streamtts_fused::ProductTeam::applies({packed.begin(), packed.end()}, rows);
#else
  return false;
#endif
}

// xs[i] times packed[i] (row_linear), plus biases[i], plus residuals[i] where given
// (row_linear_add), made in turn by one team: its outputs.
std::vector<Tensor> team_products(at::TensorList xs, at::TensorList packed,
                                  const c10::List<std::optional<Tensor>>& biases,
                                  const c10::List<std::optional<Tensor>>& residuals) {
  TORCH_CHECK(xs.size() == packed.size() && biases.size() == packed.size() &&
                  residuals.size() == packed.size(),
              "team_products: one input, bias and residual per weight");
  std::vector<Tensor> outputs;
#if defined(__x86_64__) && defined(_OPENMP)
  int64_t rows = 0;
  for (const Tensor& x : xs) rows = std::max(rows, x.numel() / std::max<int64_t>(1, x.size(-1)));
  std::vector<Tensor> order(packed.begin(), packed.end());
  TORCH_CHECK(streamtts_fused::ProductTeam::applies(order, rows),
              "team_products: no product team applies here");
  streamtts_fused::ProductTeam team(std::move(order));
  team.run([&] {
    for (size_t i = 0; i < packed.size(); ++i) {
      outputs.push_back(team.product(xs[i], packed[i], biases.get(i), residuals.get(i)));
    }
  });
#else
  TORCH_CHECK(false, "team_products: no product team in this build");
#endif
  return outputs;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &streamtts_fused::rms_norm);
  m.def("rotate_pairs_rounded(Tensor rows, int heads, int dh, Tensor cos, Tensor sin) -> Tensor",
        &streamtts_fused::rotate_pairs_rounded);
  m.def("product_team_applies(Tensor[] packed, int rows) -> bool", &product_team_applies);
  m.def("team_products(Tensor[] xs, Tensor[] packed, Tensor?[] biases, Tensor?[] residuals) "
        "-> Tensor[]",
        &team_products);
}
