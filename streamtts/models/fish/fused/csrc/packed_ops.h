// What both fused ops share: oneDNN's linear on packed weights, RMSNorm, the layer layout.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace streamtts_fused {

using at::Tensor;

constexpr int64_t kTensorsPerLayer = 4;  // wqkv, wo, w13, w2 (packed)
constexpr int64_t kNormsPerLayer = 2;    // attention_norm, ffn_norm

// row_linear.cpp's op: bf16 rows times a weight in the pairs layout (PairedLinear.forward).
// Called through the dispatcher, as oneDNN's is, so the profiler sees each product.
inline Tensor row_linear(const Tensor& x, const Tensor& packed,
                         const std::optional<Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("streamtts_fused::row_linear", "")
                             .typed<Tensor(const Tensor&, const Tensor&,
                                           const std::optional<Tensor>&)>();
  return op.call(x, packed, bias);
}

// A packed layer's product, [..., in] -> [..., out] (PackedLinear.forward): row_linear for a
// weight in the pairs layout (a plain tensor), else oneDNN's linear on a weight packed by
// mkldnn::_reorder_linear_weight (an MkldnnCPU tensor).
inline Tensor packed_linear(const Tensor& x, const Tensor& packed,
                            const std::optional<Tensor>& bias) {
  if (!packed.is_mkldnn()) return row_linear(x, packed, bias);
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                        c10::string_view, c10::List<std::optional<c10::Scalar>>,
                        std::optional<c10::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<c10::Scalar>>(), std::nullopt);
}

// A head's logits [..., width]: a paired head's product has its last task's padding beyond
// `width` (pairs.py), dropped as PairedLinear.forward drops it.
inline Tensor head_outputs(const Tensor& y, int64_t width) {
  return y.size(-1) == width ? y : y.narrow(-1, 0, width).contiguous();
}

// RMSNorm.forward: normalised in fp32 and rounded once (at::rms_norm), then times the weight.
inline Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return at::rms_norm(x, {x.size(-1)}, std::nullopt, eps).mul(weight);
}

// FeedForward with the gate and up projections fused, after its norm: x [..., D] -> [..., D].
inline Tensor feed_forward(const Tensor& normed, const Tensor& w13, const Tensor& w2) {
  Tensor gate_up = packed_linear(normed, w13, std::nullopt);
  std::vector<Tensor> halves = gate_up.chunk(2, -1);
  return packed_linear(at::silu(halves[0]).mul(halves[1]), w2, std::nullopt);
}

// The weight lists of `n_layers` blocks, as the Python side passes them (fused/layers.py).
inline void check_layers(const char* op, at::TensorList norms, at::TensorList packed,
                         int64_t n_layers) {
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == kNormsPerLayer * n_layers, op,
              ": expected ", kNormsPerLayer * n_layers, " norms");
  TORCH_CHECK(static_cast<int64_t>(packed.size()) == kTensorsPerLayer * n_layers, op,
              ": expected ", kTensorsPerLayer * n_layers, " packed weights");
}

}  // namespace streamtts_fused
